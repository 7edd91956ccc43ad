"""Seconds per GRPO iteration of TRL's GRPOTrainer on the shared peer workload (CPU, float32).

Workload: a random-init Qwen2 (4 layers, 4 heads, 2 KV heads, tied embeddings), a word-level
tokenizer over "t0".."t{V-1}", prompts of exactly --prompt_len tokens, --prompts x --group
completions of exactly --new_tokens tokens per iteration, beta > 0 (reference forward runs), one
AdamW step per iteration on the whole batch. Everything is built locally; no network.

With --eos_ids K > 0 the completions are long-tailed instead (bench_rollouts.py's workload):
K word ids end a row besides EOS, so a row ends with probability about K/V per token, up to
--new_tokens; TRL's generate pads every row to the longest and the update runs on the padded
batch. The result then has the sampled tokens of each iteration.

Run with the TRL venv (never with grpo_jax's):
    /work/peers/trl/bin/python benchmarks/peers/trl_grpo.py --hidden 128
The last line printed is `RESULT {json}`.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_DISABLED="true",
                  TOKENIZERS_PARALLELISM="false")

import numpy as np
import torch
import transformers
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                          TrainerCallback)
from trl import GRPOConfig, GRPOTrainer

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--prompt_len", type=int, default=16)
p.add_argument("--new_tokens", type=int, default=64)
p.add_argument("--prompts", type=int, default=8)
p.add_argument("--group", type=int, default=8)
p.add_argument("--iterations", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--lr", type=float, default=1e-5)
p.add_argument("--beta", type=float, default=0.04)
p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
p.add_argument("--eos_ids", type=int, default=0,
               help="> 0: this many word ids also end a row (long-tailed lengths)")
args = p.parse_args()
torch.set_num_threads(args.threads)
H, V = args.hidden, args.vocab
total_steps = args.warmup + args.iterations
batch = args.prompts * args.group

# Tokenizer: one word per id, whitespace-split. Special tokens are matched as substrings, so
# pad/eos are the two highest ids: "t{V-1}" is no prefix of any other word (e.g. "t1" would
# split "t139").
PAD, EOS = V - 1, V - 2
vocab = {f"t{i}": i for i in range(V)}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=f"t{PAD}"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=f"t{PAD}",
                                    eos_token=f"t{EOS}", unk_token=f"t{PAD}", padding_side="left")

# Model: random init from a config, seed 0.
torch.manual_seed(args.seed)
config = Qwen2Config(
    vocab_size=V, hidden_size=H, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=H // 4, intermediate_size=int(2.6875 * H),
    tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
    max_position_embeddings=128, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
    attn_implementation=args.attn)
model = Qwen2ForCausalLM(config).to(torch.float32)
n_params = sum(p.numel() for p in model.parameters())
# GRPOTrainer builds the reference model by from_pretrained(model.config._name_or_path), so
# save the random weights locally and point the config there (the reference is then identical).
workdir = tempfile.mkdtemp(prefix="trl_grpo_bench_")
model.save_pretrained(os.path.join(workdir, "init"))
model.config._name_or_path = os.path.join(workdir, "init")

# Dataset: a few hundred plain-text prompts of exactly prompt_len tokens (no pad/eos ids).
rng = np.random.default_rng(args.seed)
prompts = [" ".join(f"t{i}" for i in rng.integers(0, EOS, args.prompt_len)) for _ in range(256)]
assert all(len(tokenizer(s)["input_ids"]) == args.prompt_len for s in prompts)
dataset = Dataset.from_dict({"prompt": prompts})

seen = {"lengths": set(), "group_reward_std": [], "calls": 0, "tokens": []}
# long-tailed: ids V-4-K .. V-5 end a row too (bench_rollouts.py's EOS_IDS), and EOS
ENDS = set(range(V - 4 - args.eos_ids, V - 4)) | {EOS} if args.eos_ids else {EOS}


def sampled_length(ids) -> int:
    """Tokens up to and including the first that ends the row."""
    for i, t in enumerate(ids):
        if int(t) in ENDS:
            return i + 1
    return len(ids)


def even_fraction(completions, completion_ids, **kwargs):
    """Reward: fraction of completion tokens with an even id (varies within a group)."""
    seen["calls"] += 1
    seen["lengths"].update(len(c) for c in completion_ids)
    seen["tokens"].append(sum(sampled_length(c) for c in completion_ids))
    r = np.array([np.mean([t % 2 == 0 for t in c]) for c in completion_ids], dtype=np.float64)
    seen["group_reward_std"].append(float(r.reshape(-1, args.group).std(axis=1).mean()))
    return r.tolist()


class Timer(TrainerCallback):
    """Wall time per optimizer step; the first is measured from the start of train()."""

    def __init__(self):
        self.marks = []

    def on_train_begin(self, *a, **k):
        self.marks = [time.perf_counter()]

    def on_step_end(self, *a, **k):
        self.marks.append(time.perf_counter())


gcfg = GRPOConfig(
    output_dir=os.path.join(workdir, "out"),
    use_cpu=True, bf16=False, fp16=False,          # TRL defaults bf16=True: force float32
    gradient_checkpointing=False,                  # TRL defaults this to True
    per_device_train_batch_size=batch,             # counts completions, not prompts
    gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
    num_generations=args.group, max_completion_length=args.new_tokens,
    # min_new_tokens == max suppresses EOS, so every row generates all new_tokens tokens;
    # long-tailed: any of ENDS stops a row.
    generation_kwargs=({"eos_token_id": sorted(ENDS)} if args.eos_ids
                       else {"min_new_tokens": args.new_tokens}),
    temperature=1.0, top_k=0, top_p=1.0,
    beta=args.beta, learning_rate=args.lr, lr_scheduler_type="constant",
    optim="adamw_torch", weight_decay=0.0,
    max_steps=total_steps, logging_steps=10**6, save_strategy="no", report_to="none",
    disable_tqdm=True, seed=args.seed, dataloader_num_workers=0,
)
timer = Timer()
trainer = GRPOTrainer(model=model, reward_funcs=even_fraction, args=gcfg,
                      train_dataset=dataset, processing_class=tokenizer, callbacks=[timer])

# Time the generation call itself (model.generate on the whole batch) by wrapping the method.
gen_times = []
_orig_generate = trainer._generate_single_turn


def _timed_generate(*a, **k):
    t = time.perf_counter()
    out = _orig_generate(*a, **k)
    gen_times.append(time.perf_counter() - t)
    return out


trainer._generate_single_turn = _timed_generate

trainer.train()

shutil.rmtree(workdir, ignore_errors=True)
steps = np.diff(timer.marks).tolist()
# Sanity checks on the workload actually run.
assert trainer.state.global_step == total_steps, trainer.state.global_step
assert len(steps) == total_steps and len(gen_times) == total_steps, (len(steps), len(gen_times))
assert args.eos_ids or seen["lengths"] == {args.new_tokens}, seen["lengths"]
assert (trainer.ref_model is not None) == (args.beta > 0)
assert not trainer.model.is_gradient_checkpointing
print(f"checks: optimizer_steps={trainer.state.global_step} generations={len(gen_times)} "
      f"completion_lengths={sorted(seen['lengths'])} ref_model={trainer.ref_model is not None} "
      f"mean_within_group_reward_std={np.mean(seen['group_reward_std']):.4f}", file=sys.stderr)

result = {
    "peer": "trl", "version": trl.__version__, "torch": torch.__version__,
    "transformers": transformers.__version__, "hidden": H, "params": n_params,
    "attn": args.attn,
    "iteration_s": [round(s, 4) for s in steps[args.warmup:]],
    "first_iteration_s": round(steps[0], 4),
    "generate_s": [round(s, 4) for s in gen_times[args.warmup:]],
    "sampled_tokens": seen["tokens"][args.warmup:],
    "config": {**vars(args), "optimizer_steps": trainer.state.global_step,
               "completions_per_iteration": batch, "loss_type": gcfg.loss_type,
               "max_grad_norm": gcfg.max_grad_norm, "scale_rewards": gcfg.scale_rewards,
               "epsilon": gcfg.epsilon, "dtype": "float32", "device": "cpu"},
}
print("RESULT " + json.dumps(result))
