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
"""

import ml_collections

from grpo_jax.config_presets import main_job
from grpo_jax.stages import default_section


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    config = main_job("cpu")
    config.stages = "eval_base,rl,eval_final"
    del config.pretrain

    config.task.name = "gsm8k"
    # data_dir: train.jsonl + test.jsonl (GSM8K release format) or a prepared TFDS dir.
    config.task.kwargs = ml_collections.ConfigDict({"data_dir": ""})
    config.task.template = "chat"  # the checkpoint's chat template + the R1-Zero layout
    config.task.prompt_len = 0  # measured at start-up: the longest prompt, rounded up to 8
    config.task.train_size = 7473  # the whole GSM8K training split
    config.task.eval_size = 1319  # the whole test split
    config.tokenizer = "checkpoint"  # the checkpoint's tokenizer.json and special tokens

    config.model.init_from = ""  # required: --config.model.init_from=<checkpoint dir>
    config.model.dtype = "bfloat16"  # compute
    config.model.param_dtype = "float32"  # master weights (and so the optimizer state)
    config.model.max_seq_len = 1024  # context: the prompt bucket + max_new_tokens fit
    config.model.logprob_chunk_size = 256  # no [B, T, 152k] logits at once
    config.model.logprob_chunk_rows = 16  # tiles of 16 x 256 x 152k float32 logits: 2.3 GiB
    config.model.remat = True  # recompute each block in the backward pass
    config.model.scan_layers = True  # one compiled block for all layers (see ModelConfig)

    config.optim.weight_decay = 0.0
    config.optim.clip_norm = 1.0
    config.optim.warmup_frac = 0.03
    config.optim.final_lr_frac = 1.0  # constant after warm-up

    config.eval_base = default_section("eval")
    config.eval_base.num_samples = 4  # pass@1 as the mean over 4 samples; pass@2, 4, maj@2, 4
    config.eval_base.temperature = 1.0
    config.eval_base.max_new_tokens = 512
    config.eval_base.batch_size = 512
    config.eval_final = ml_collections.ConfigDict(config.eval_base.to_dict())

    config.rl = default_section("rl")
    config.rl.algorithm = "grpo"
    config.rl.steps = 200
    config.rl.num_prompts = 64
    config.rl.group_size = 8
    config.rl.micro_batches = 4  # 128 sequences of up to 1024 tokens per backward pass
    config.rl.lr = 1e-6
    config.rl.beta = 0.04
    config.rl.max_new_tokens = 512
    config.rl.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    config.rl.checkpoint_every = 25

    if preset in (None, "", "gpu"):
        config.mesh.num_devices = 1
    elif preset == "tpu":
        # 8 chips; the batch is split over data x fsdp = 8 either way, the parameters and
        # optimizer state over fsdp.
        config.mesh.shape = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
        config.rl.micro_batches = 2
    elif preset == "smoke":
        config.model.dtype = "float32"
        config.model.max_seq_len = 256
        config.model.logprob_chunk_size = 0
        config.model.logprob_chunk_rows = 0
        config.model.remat = False
        config.model.scan_layers = False
        config.mesh.num_devices = 1
        config.task.train_size = 8
        config.task.eval_size = 4
        config.rl.steps = 2
        config.rl.num_prompts = 2
        config.rl.group_size = 4
        config.rl.micro_batches = 1
        config.rl.max_new_tokens = 16
        config.rl.lr = 1e-3  # a tiny random model: a visible change in two steps
        config.rl.checkpoint_every = 1
        config.rl.overlong_cache = 8  # rewards that differ within groups: real gradients
        for section in (config.eval_base, config.eval_final):
            section.num_samples = 2
            section.batch_size = 8
            section.max_new_tokens = 16
    else:
        raise ValueError(f"unknown preset {preset!r} for configs/gsm8k.py; expected smoke, "
                         "gpu or tpu")
    return config
