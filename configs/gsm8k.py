"""GRPO from a local Hugging Face checkpoint (Qwen2 / Llama) on GSM8K, offline.

The checkpoint directory holds config.json, model.safetensors (or shards with an index) and
the tokenizer files (tokenizer.json, tokenizer_config.json, optionally
generation_config.json / chat_template.jinja); the GSM8K directory holds train.jsonl and
test.jsonl (or is a prepared TFDS data directory). README "GSM8K from a real checkpoint"
says how to put both on disk.

    python -m grpo_jax.main --config=configs/gsm8k.py:gpu --workdir=runs/gsm8k \
        --config.model.init_from=$HOME/models/Qwen2.5-0.5B-Instruct \
        --config.task.kwargs.data_dir=$HOME/data/gsm8k

Stages: eval_base -> rl -> eval_final. Evaluations report the strict accuracy (the answer
inside <answer> </answer>: pass@1, pass@k, maj@k) and the lenient one (the last number of
the completion: pass@1_lenient, ...). The prompt is the checkpoint's chat template with the
R1-Zero layout instruction ("chat"); `--config.task.template=r1_zero` uses the R1-Zero text
prompt instead (base models). The prompt bucket is measured at start-up (prompt_len 0).

Presets (after the colon):
  smoke  CPU, a few seconds: two GRPO steps of 2 prompts x 4 completions on whatever local
         checkpoint and data are given (what the tests run, on a tiny random Qwen2).
  gpu    one 80-140 GB GPU, Qwen2.5-0.5B- or 1.5B-Instruct: bfloat16 compute with float32
         master weights and optimizer state, remat, chunked log-probs, 64 prompts x 8
         completions x 512 new tokens per step.
  tpu    one v5e-8 / v4-8 host (8 chips): the gpu settings with parameters and optimizer
         state sharded over the 8 chips (fsdp); on a pod slice the same command runs on
         every worker (README "Running on a TPU pod").

Every field: grpo_jax/config_presets.py (`gsm8k_job`); `--config=gsm8k[:preset]` runs it from any
folder.
"""

import ml_collections

from grpo_jax.config_presets import gsm8k_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return gsm8k_job(preset)
