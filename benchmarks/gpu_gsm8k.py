"""The `configs/gsm8k.py:gpu` GRPO iteration on one GPU, with random Qwen2.5-shaped weights.

Nothing is downloaded: the script writes a random checkpoint of the named shape (default
Qwen2.5-0.5B, 494M parameters; bfloat16 compute over float32 master weights as the preset
says), a byte-level BPE tokenizer with a ChatML chat template and 512 GSM8K-format rows into
`--scratch`, prints a memory plan and the speed bounds, runs the preset's rl stage for
`--steps` iterations, then times the sampler alone on the device and the host's share of a
rollout apart.

    python benchmarks/gpu_gsm8k.py --steps 4                    # the GPU run (minutes)
    python benchmarks/gpu_gsm8k.py --plan_only [--model qwen2.5-7b] [--prompt_len 256]
    python benchmarks/gpu_gsm8k.py --dry_run                    # every line, tiny, on CPU

`--model` (alias `--size`) is a `grpo_jax.models.named_config` name (tiny-1m, tiny-10m,
qwen2.5-0.5b, qwen2.5-1.5b, llama-3.2-1b) or qwen2.5-7b (its shape is defined here, from
the released config.json); `--num_layers` cuts its depth. `--plan_only` needs no GPU and
writes no checkpoint (only the tokenizer and rows that measure the prompt bucket, none with
`--prompt_len`): seconds, any shape. `--dry_run` is the whole script on a one-layer
`tiny-1m` at 4 prompts x 2 completions x 8 new tokens, 2 micro-batches, 2 steps, one timed
sampler call (its `--set` items come before yours): what the CPU test runs, and the smoke
test on the GPU before the real run. Every number is computed the same way on any device;
on CPU the MFU and bandwidth fractions are against the GPU's peaks and mean nothing. Where
the plan's peak exceeds the device's memory pool the script stops (exit 2) before writing
the checkpoint (`--force` runs anyway). `--set rl.x=...` overrides any preset field.

Output, in this order (GiB = 2^30 bytes for memory, GB = 1e9 for traffic; `<..>` are
measured; the example figures are the 0.5B preset with the 152-token prompt bucket the
script's tokenizer gives; the pipeline's own `[grpo_jax] ...` progress lines come between
`assets` and the table):

    config: qwen2.5-0.5b (494M parameters; compute bfloat16, master weights float32), 64 prompts x 8 completions = 512 rows, prompt bucket 152 + 512 new tokens, micro_batches 4, logprob chunk 256 positions x 16 rows, remat on, scan_layers on, beta 0.04
    plan persistent: params 1.84 + AdamW m, v 3.68 + reference 1.84 = 7.36 GiB
    plan rollout: KV cache 3.89 (+ 3.14 while the last cache phase grows it) + bfloat16 weights 0.92 + sampler logits 0.58 = 8.53 GiB
    plan reference pass: 512 rows in chunks of 128, forward only: logits tile 2.32 + one layer 3.93 + hidden 0.11 + bfloat16 weights 0.92 + stacked layers 1.33 = 8.61 GiB
    plan update: micro-batch of 128 rows: grads 1.84 + accumulator 1.84 + bfloat16 weights 0.92 + stacked layers 2.67 + activations 14.73 (without remat 144.07) + hidden 0.22 + logits tile 4 x 2.32 = 31.49 GiB
    plan optimizer step: grads 1.84 + new params, m, v 5.52 = 7.36 GiB
    plan peak: 38.85 GiB = persistent 7.36 + update 31.49
    plan H200 141GB: 140.4 GiB card, pool 90% = 126.4 GiB: fits (31% of the pool)
    plan 80GB card: 79.6 GiB card, pool 90% = 71.7 GiB: fits (54% of the pool)
    bound update: 1101 TFLOP of model FLOPs per iteration (4 forward-equivalents; prompts 3%, output head 26% of a forward); 2.78 s at the 40% MFU goal of 989 TFLOP/s
    bound sampler: 0.386 s per rollout at 4.8 TB/s: 511 decode passes reading 3.55 GB on average (weights 0.99 GB bfloat16 + KV cache 2.57 GB), prefill 0.007 s; the float32 logits add 0.31 GB per pass (not counted); compute alone 0.28 s at 989 TFLOP/s
    device: <NVIDIA H200> (<gpu>), <1> device(s), pool <126.4> GiB; jax <..>, jaxlib <..>, flax <..>, optax <..>, orbax-checkpoint <..>
    assets: <..> s, <scratch>/qwen2.5-0.5b, <scratch>/gsm8k
    | step | sample s | update s | step s | generated tok/s | update MFU |
    |---|---|---|---|---|---|
    | <1> | <..> | <..> | <..> | <..> | <..>% |
    iterations: <4> in <..> s wall (compiling <..> s); steady state (steps 2..<4>): sample <..> s, update <..> s, iteration <..> s, <..> tokens/s overall
    update MFU: <..>% of 989 TFLOP/s (1101 TFLOP in <..> s; goal >= 40%: <met|not met>)
    memory after the iterations: peak <..> GiB in use (plan 38.85 GiB)
    sampler: <3> calls after a warm-up, prompts on device, float32 master weights as the rollout passes them: <..> s per rollout, <..> generated tokens/s, <..> of the HBM bound (goal >= 0.6: <met|not met>)
    sampler compute-dtype copy: the weights cast to bfloat16 once: <..> s per rollout, <..> generated tokens/s, <..> of the HBM bound
    host: per rollout: tokenising <..> s, to device <..> s, to host <..> s, detokenising <..> s, scoring <..> s
    memory at the end: peak <..> GiB in use
    result: | <NVIDIA H200> | qwen2.5-0.5b shape | <sample s> | <update s> | <generated tok/s> | <MFU>% | <sampler s> s, <fraction> of bound |

`result` is a row of benchmarks/README.md's GPU table. The `sampler compute-dtype copy`
line reads `skipped (...)` where compute and master dtypes are the same. `memory` lines read
`n/a` where the device keeps no statistics (CPU).

**Update MFU** is `update_model_flops` over the rl stage's `update_time_s` (the reference
forward in `prepare` and the train step; the batch's transfer is in `sample_time_s`) against
`--peak_tflops` (default 989, the H100 / H200 SXM dense bfloat16 datasheet figure). The
model FLOPs are those the update computes (`models.completion_logprobs`): each group's
prompt once (the G rows of a group share it), every row's completion positions (padding
after EOS included: the program computes it), the output head on completion positions
only, causal attention (each query against the keys before it), and per pass 1x forward,
3x for forward + backward: the policy's forward and backward plus the reference forward
when beta != 0, plus an old-policy forward where the algorithm needs one (off-policy
passes, KL in the reward), times `num_iterations`. Remat's recomputation is not counted
(MFU counts model FLOPs, not hardware FLOPs). The first iteration (compilation) is left out
of the averages.

**The sampler's bound** (`sampler_bound`): the n - 1 decode passes of a call whose longest
row has n tokens (column 0 comes from the prefill; the loop stops when every row has
ended), each reading the weights once in the compute dtype (all parameters but an untied
input embedding, whose rows are gathered) and every row's KV cache filled so far (pass k
reads prompt bucket + k positions of keys and values of each layer's KV heads), at
`--hbm_tbps` (default 4.8, the H200 datasheet), plus the prefill at its roofline
(max(FLOPs / peak, weights / bandwidth)). Not counted: the float32 logits each pass writes
(printed beside), the buffer beyond the filled part that a cache phase allocates ahead,
sampling's elementwise work. Decoding 512 rows at once is near the ridge (its compute alone
is printed too), so 0.6 of the bandwidth bound is a demanding goal. The sampler is timed
as the rollout calls it (`sampling.generate` with the run's `SamplingConfig`, the prompts
already on the device, `jax.block_until_ready` on the output), median of `--sampler_calls`
after one warm-up call that compiles; the host's tokenising, transfers, detokenising and
scoring of the same batch are timed apart (the rl stage's `sample_time_s` is their sum with
the sampler's). It is timed twice: on the float32 master weights, as the rollout passes
them, and on a bfloat16 copy made once; a gap between the two is XLA casting the weights
inside the decode loop at every pass (8 bytes per parameter instead of 2), which a
library-side cast before `generate` would remove.

**The memory plan** (`memory_plan`; n parameters, n_b of them in the blocks, p = master
bytes (4), c = compute bytes (2), R = prompts x G rows, u = prompts, P + C tokens, m
micro-batches of b = R / m rows and u_b = u / m groups (u_b = b when a micro-batch cuts a
group), k = `model.logprob_chunk_size` (C when 0 or larger), t(r) = the rows of a logits
tile in a pass over r rows (`model.logprob_chunk_rows` when it divides r, else r), V
vocabulary, D hidden, L layers, N / K heads / KV heads of width H, F the MLP width):
  - persistent: params p n, AdamW m and v 2 p n, the reference copy p n (beta != 0);
  - rollout: KV cache 2 L K H c R (P + C), plus the previous buffer while the last of the
    4 cache phases grows it, the compute-dtype copy of the weights c n (when c != p), the
    float32 logits and their Gumbel-noised copy 2 x 4 R V;
  - reference pass (`prepare`, forward only, in chunks of b = R / m rows, whole groups;
    also the old policy's pass where there is one): one float32 logits tile 4 t(b) k V
    (log-softmax's reductions fuse into it), one block's live activations
    (`layer_forward_bytes`: the residual stream in and out, and the larger of attention,
    with the float32 scores and their softmax, and the MLP), the final hidden states
    c b (C + 1) D, the weight copy,
    the stacked block weights p n_b with scan_layers;
  - update (one micro-batch): gradients p n, their accumulator p n when m > 1, the weight
    copy, with scan_layers the stacked block weights and their stacked gradients 2 p n_b;
    activations: with remat (and scan_layers) the saved block inputs c L (u_b P + b C) D
    plus 2 A(b, u_b) for the block whose backward runs, else L A(b, u_b) (remat without
    scan_layers is counted as off: XLA:CPU schedules that recomputation early and keeps
    every layer's activations; the GPU run's measured peak says what XLA:GPU does); the
    final hidden states and their gradient 2 c b (C + 1) D; 4 float32 logits tiles
    4 t(b) k V (the logits, their log-softmax, its exponent for the entropy, their
    gradient);
  - optimizer step: gradients, and new params, m, v before the finite check keeps them 3 p n;
  - A(rows, groups), what a block's backward reads: c (groups P + rows C) (4 D + 2 N H +
    2 K H + 3 F) + c rows P 2 K H (the prompt's keys and values spread to its rows) +
    (4 + c) N (groups P^2 + rows C (P + C)) (the float32 softmax and its compute-dtype copy;
    attention computes the masked square);
  - peak = persistent + the largest phase. A card fits a plan whose peak is within its
    pool, `XLA_PYTHON_CLIENT_MEM_FRACTION` of it (the script sets 0.90 before the backend
    starts unless it is set; JAX's default is 0.75), leaving room for cuBLAS workspaces and
    fragmentation. The suggestion keeps the chunk and raises micro_batches (divisors of the
    prompts: whole groups) first, then halves the chunk down to 16. On tiny float32 shapes
    XLA:CPU's buffer assignment holds 0.9-1.3x the plan's reference pass (0.94x where the
    logits dominate: tests/test_gpu_benchmark.py) and 0.66-0.92x its update (the 4 logits
    copies are about 2.6 there); the GPU run prints the device's measured peak beside the
    plan's.

Carrying it to a machine without a package index: benchmarks/README.md, "GRPO on one GPU".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
import types


CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}{% for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Shapes grpo_jax.models.named_config does not have (from the released config.json).
EXTRA_SHAPES = {
    "qwen2.5-7b": {"vocab_size": 152064, "hidden_size": 3584, "num_layers": 28,
                   "num_heads": 28, "num_kv_heads": 4, "head_dim": 128, "mlp_size": 18944,
                   "max_seq_len": 32768, "rope_theta": 1000000.0, "qkv_bias": True,
                   "tie_embeddings": False, "rms_norm_eps": 1e-6, "dtype": "bfloat16",
                   "param_dtype": "bfloat16"},
}
# (name, bytes) of the cards the plan is read against: nvidia-smi's total of an H200 and of
# an H100 80GB (an A100 80GB shows 81920 MiB).
CARDS = (("H200 141GB", 143771 * 2**20), ("80GB card", 81559 * 2**20))
DEFAULT_POOL = "0.90"
GOAL_MFU, GOAL_BANDWIDTH = 0.40, 0.60
CACHE_PHASES = 4  # SamplingConfig.cache_phases' default, which the rollouts use
DRY_RUN_SETS = ("rl.num_prompts=4", "rl.group_size=2", "rl.max_new_tokens=8",
                "rl.micro_batches=2")
GiB = 2**30


# ---------------------------------------------------------------------------- the assets
def model_shape(name: str, **overrides):
    """The ModelConfig of a named_config name or of EXTRA_SHAPES."""
    from grpo_jax.models import ModelConfig, available_models, named_config

    if name in EXTRA_SHAPES:
        return ModelConfig(**{**EXTRA_SHAPES[name], **overrides})
    if name not in available_models():
        raise SystemExit(f"--model {name!r}: expected one of "
                         f"{sorted(available_models() + list(EXTRA_SHAPES))}")
    return named_config(name, **overrides)


def run_shape(name: str, *, num_layers: int = 0, dtype: str = "float32",
              param_dtype: str = "float32", remat: bool = False):
    """The shape of the checkpoint `write_assets` writes for `name` (the vocabulary at least
    4096, the context at least 2048), with the run's numerics."""
    shape = model_shape(name)
    shape = shape.replace(vocab_size=max(shape.vocab_size, 4096),
                          max_seq_len=max(shape.max_seq_len, 2048), dtype=dtype,
                          param_dtype=param_dtype, remat=remat)
    return shape.replace(num_layers=num_layers) if num_layers else shape


def _rows(n, offset=0):
    out = []
    for i in range(n):
        a, b = 3 + (i + offset) % 97, 2 + (i * 7 + offset) % 13
        out.append({
            "question": f"A shop sells {a} boxes of {b} pencils each. A teacher buys all of "
                        f"them and gives {b} pencils to each student. How many students get "
                        "pencils?",
            "answer": f"There are {a}*{b}=<<{a}*{b}={a * b}>>{a * b} pencils.\n"
                      f"{a * b}/{b}=<<{a * b}/{b}={a}>>{a} students.\n#### {a}"})
    return out


def write_data(scratch: str) -> str:
    """512 training and 128 test rows in GSM8K's JSONL format."""
    data = os.path.join(scratch, "gsm8k")
    os.makedirs(data, exist_ok=True)
    for name, rows in (("train.jsonl", _rows(512)), ("test.jsonl", _rows(128, 1000))):
        with open(os.path.join(data, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return data


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_tokenizer(directory: str) -> str:
    """A byte-level BPE tokenizer (4000 tokens, ChatML specials and template), once."""
    if all(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES):
        return directory
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(directory, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [r["question"] + " " + r["answer"] for r in _rows(2000)]
    corpus += ["<think> reasoning </think> <answer> 42 </answer>"] * 50
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": CHAT_TEMPLATE}, f)
    return directory


def random_model(config, seed: int = 0):
    """A Transformer of `config` with random weights drawn by numpy (N(0, 0.02) matrices,
    unit norm scales, zero biases): no per-parameter XLA programs, seconds for 0.5B."""
    import jax
    import numpy as np
    from flax import nnx

    from grpo_jax.models import Transformer

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config,
                                                                   rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = str(getattr(path[-1], "key", path[-1]))
        if name == "scale":
            return np.ones(leaf.shape, leaf.dtype)
        if name.endswith("bias"):
            return np.zeros(leaf.shape, leaf.dtype)
        x = rng.standard_normal(leaf.shape, np.float32)
        x *= 0.02
        return x.astype(leaf.dtype, copy=False)

    values = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def write_assets(scratch: str, size: str, num_layers: int = 0) -> tuple[str, str]:
    """A random float32 checkpoint of the named shape with the BPE tokenizer, and the GSM8K
    rows; an existing checkpoint is kept."""
    import jax

    from grpo_jax.models import save_pretrained

    data = write_data(scratch)
    tokenizer = write_tokenizer(os.path.join(scratch, "tokenizer"))
    ckpt = os.path.join(scratch, size + (f"-{num_layers}l" if num_layers else ""))
    if not (os.path.isfile(os.path.join(ckpt, "model.safetensors.index.json"))
            or os.path.isfile(os.path.join(ckpt, "model.safetensors"))):
        config = run_shape(size, num_layers=num_layers)
        with jax.default_device(jax.devices("cpu")[0]):
            save_pretrained(random_model(config), config, ckpt, max_shard_bytes=2 << 30)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer, name), os.path.join(ckpt, name))
    return ckpt, data


# ---------------------------------------------------------------------------- the counts
def _body_and_head(shape) -> tuple[int, int]:
    """(parameters of the layers, parameters of the output head) of a ModelConfig: the head
    is the embedding matrix when tied (it also embeds, a lookup without FLOPs)."""
    embed = shape.vocab_size * shape.hidden_size
    untied_head = 0 if shape.tie_embeddings else embed
    return shape.num_params() - embed - untied_head, embed


def update_model_flops(shape, *, prompts: int, group_size: int, prompt_len: int,
                       new_tokens: int, reference: bool, old_policy: bool = False,
                       iterations: int = 1) -> dict:
    """Model FLOPs of one GRPO update over `prompts` x `group_size` rows of `prompt_len` +
    `new_tokens` tokens, as `completion_logprobs` computes them; a dict of the parts and
    "total" (see the module docstring). `iterations` passes (fwd + bwd) over the batch, one
    reference forward when `reference`, one old-policy forward when `old_policy`."""
    body, head = _body_and_head(shape)
    p, c = prompt_len, new_tokens
    per_head_layer = shape.num_layers * shape.num_heads * shape.head_dim
    # Causal attention: the QK^T and AV products, 2 FLOPs per multiply-add, each query
    # against the keys up to it: P^2 / 2 pairs in the prompt, C * P + C^2 / 2 for a completion.
    prompt = 2 * body * p + 4 * per_head_layer * (p * p / 2)
    row = 2 * body * c + 2 * head * c + 4 * per_head_layer * (c * p + c * c / 2)
    forward = prompts * (prompt + group_size * row)
    passes = 3 * iterations + (1 if reference else 0) + (1 if old_policy else 0)
    return {"forward": forward, "passes": passes, "total": passes * forward,
            "prompt_share": prompts * prompt / forward,
            "head_share": prompts * group_size * 2 * head * c / forward}


def weights_read_bytes(shape, weight_bytes: int = 2) -> int:
    """Bytes of the weights one forward pass reads: every parameter but an untied input
    embedding (a gather of a few rows)."""
    untied_embedding = 0 if shape.tie_embeddings else shape.vocab_size * shape.hidden_size
    return weight_bytes * (shape.num_params() - untied_embedding)


def kv_bytes_per_position(shape, cache_bytes: int = 2) -> int:
    """Bytes of one row's keys and values at one position, all layers."""
    return cache_bytes * 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim


def decode_bytes_per_step(shape, *, rows: int, context: int, weight_bytes: int = 2,
                          cache_bytes: int = 2) -> float:
    """Bytes one decode step reads: the weights once (`weights_read_bytes`), and every row's
    KV cache of `context` positions (keys and values of each layer's KV heads)."""
    return (weights_read_bytes(shape, weight_bytes)
            + kv_bytes_per_position(shape, cache_bytes) * context * rows)


def sampler_bound(shape, *, rows: int, groups: int, prompt_len: int, generated: int,
                  hbm_tbps: float, peak_tflops: float, compute_bytes: int = 2) -> dict:
    """The HBM-bandwidth bound of one `generate` call whose longest row has `generated`
    tokens (module docstring): its n - 1 decode passes, pass k (1..n-1) reading the weights
    and prompt_len + k positions of every row's KV cache, plus the prefill of `groups`
    prompts at its roofline. Seconds and bytes in a dict."""
    passes = max(generated - 1, 0)
    weights = weights_read_bytes(shape, compute_bytes)
    kv_row = kv_bytes_per_position(shape, compute_bytes) * rows
    positions = passes * prompt_len + passes * (passes + 1) / 2  # sum of prompt_len + k
    total = passes * weights + kv_row * positions
    bandwidth = hbm_tbps * 1e12
    peak = peak_tflops * 1e12
    body, head = _body_and_head(shape)
    per_head_layer = shape.num_layers * shape.num_heads * shape.head_dim
    prefill_flops = groups * (2 * body * prompt_len + 2 * head
                              + 4 * per_head_layer * prompt_len * prompt_len / 2)
    prefill_s = max(prefill_flops / peak, weights / bandwidth)
    decode_flops = (passes * rows * 2 * (body + head)
                    + 4 * per_head_layer * rows * positions)
    return {"passes": passes, "bytes": total, "weights": weights,
            "kv_mean": kv_row * positions / passes if passes else 0.0,
            "step_mean": total / passes if passes else 0.0,
            "logits_per_pass": 4 * rows * shape.vocab_size,
            "bandwidth_s": total / bandwidth, "prefill_s": prefill_s,
            "bound_s": total / bandwidth + prefill_s,
            "compute_s": (decode_flops + prefill_flops) / peak}


def phase_ends(new_tokens: int, phases: int = CACHE_PHASES) -> tuple[int, ...]:
    """`SamplingConfig.phase_ends`: the completion columns at which each cache phase ends."""
    from grpo_jax.sampling import SamplingConfig

    return SamplingConfig(max_new_tokens=new_tokens, cache_phases=phases).phase_ends


def layer_activation_bytes(shape, *, rows: int, groups: int, prompt_len: int,
                           new_tokens: int, compute_bytes: int = 2) -> float:
    """A(rows, groups): one block's activations that its backward reads (module docstring)."""
    d, n, k, h, f = (shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                     shape.mlp_size)
    p, c = prompt_len, new_tokens
    tokens = groups * p + rows * c
    linear = compute_bytes * tokens * (4 * d + 2 * n * h + 2 * k * h + 3 * f)
    spread_kv = compute_bytes * rows * p * 2 * k * h
    maps = n * (groups * p * p + rows * c * (p + c))
    return linear + spread_kv + (4 + compute_bytes) * maps


def layer_forward_bytes(shape, *, rows: int, groups: int, prompt_len: int, new_tokens: int,
                        compute_bytes: int = 2) -> float:
    """One block's live activations in a forward-only pass: the residual stream in and out,
    and the larger of attention (q, the output, the spread prompt keys and values, the
    float32 scores and their softmax) and the MLP (gate, up, their product)."""
    d, n, k, h, f = (shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                     shape.mlp_size)
    p, c = prompt_len, new_tokens
    tokens = groups * p + rows * c
    maps = n * (groups * p * p + rows * c * (p + c))
    attention = (compute_bytes * (tokens * (2 * n + 2 * k) * h + rows * p * 2 * k * h)
                 + (4 + compute_bytes) * maps)
    return compute_bytes * tokens * 2 * d + max(attention, compute_bytes * tokens * 3 * f)


def memory_plan(shape, *, prompts: int, group_size: int, prompt_len: int, new_tokens: int,
                micro_batches: int = 1, logprob_chunk: int = 0, logprob_chunk_rows: int = 0,
                remat: bool = True,
                scan_layers: bool = False, reference: bool = True,
                prepare_pass: bool | None = None, param_bytes: int = 4,
                compute_bytes: int = 2, cache_phases: int = CACHE_PHASES) -> dict:
    """Bytes of each part of a GRPO iteration on one device, by phase (module docstring):
    {"persistent", "rollout", "reference pass", "update", "optimizer step"} -> {part: bytes},
    and "peak", "peak_phase", "no_remat" (the update's activations without remat).
    `reference`: a reference copy is kept (beta != 0); `prepare_pass` (default
    `reference`): a forward pass over the whole batch runs before the update (the
    reference's, or the old policy's)."""
    prepare_pass = reference if prepare_pass is None else prepare_pass
    n, v, d, layers = shape.num_params(), shape.vocab_size, shape.hidden_size, shape.num_layers
    rows, p, c = prompts * group_size, prompt_len, new_tokens
    # `prepare` runs its passes in chunks of a micro-batch's whole groups
    ref_rows = rows // micro_batches if prompts % micro_batches == 0 else rows
    cast = compute_bytes * n if compute_bytes != param_bytes else 0
    chunk = c if not logprob_chunk or logprob_chunk >= c else logprob_chunk
    tile = lambda r: (r if not logprob_chunk_rows or logprob_chunk_rows >= r
                      or r % logprob_chunk_rows else logprob_chunk_rows)
    body, _ = _body_and_head(shape)
    blocks = body - d  # the final norm is no block's
    kv_row = kv_bytes_per_position(shape, compute_bytes)
    ends = phase_ends(c, cache_phases)
    hidden = lambda r: compute_bytes * r * (c + 1) * d

    def act(r, g):
        return layer_activation_bytes(shape, rows=r, groups=g, prompt_len=p, new_tokens=c,
                                      compute_bytes=compute_bytes)

    plan = {
        "persistent": {"params": param_bytes * n, "adam": 2 * param_bytes * n,
                       "reference": param_bytes * n if reference else 0},
        "rollout": {"kv_cache": kv_row * rows * (p + c),
                    "kv_growth": kv_row * rows * (p + ends[-2]) if len(ends) > 1 else 0,
                    "weights": cast, "logits": 2 * 4 * rows * v},
        "reference pass": ({"logits": 4 * tile(ref_rows) * chunk * v,
                            "layer": layer_forward_bytes(shape, rows=ref_rows,
                                                         groups=ref_rows // group_size,
                                                         prompt_len=p, new_tokens=c,
                                                         compute_bytes=compute_bytes),
                            "hidden": hidden(ref_rows), "weights": cast,
                            "stacked": param_bytes * blocks if scan_layers else 0}
                           if prepare_pass else {}),
    }
    b = rows // micro_batches
    groups = b // group_size if b % group_size == 0 else b
    saved = compute_bytes * layers * (groups * p + b * c) * d
    with_remat, without = saved + 2 * act(b, groups), layers * act(b, groups)
    plan["update"] = {"grads": param_bytes * n,
                      "accumulator": param_bytes * n if micro_batches > 1 else 0,
                      "weights": cast, "stacked": 2 * param_bytes * blocks if scan_layers else 0,
                      "activations": with_remat if remat and scan_layers else without,
                      "hidden": 2 * hidden(b), "logits": 4 * 4 * tile(b) * chunk * v}
    plan["optimizer step"] = {"grads": param_bytes * n, "new_state": 3 * param_bytes * n}
    phases = ("rollout", "reference pass", "update", "optimizer step")
    totals = {k: sum(plan[k].values()) for k in ("persistent",) + phases}
    peak_phase = max(phases, key=lambda k: totals[k])
    plan.update(totals=totals, peak_phase=peak_phase, no_remat=without, micro_rows=b,
                chunk=chunk, rows=rows, ref_rows=ref_rows, tile_rows=(tile(ref_rows), tile(b)),
                peak=totals["persistent"] + totals[peak_phase])
    return plan


def suggest_fit(shape, pool: float, **batch) -> tuple[int, int, dict] | None:
    """(micro_batches, logprob chunk, plan) of the first setting whose peak fits `pool`
    bytes: the batch's chunk with micro_batches raised through the divisors of the prompts,
    then each halved chunk down to 16; None if none does."""
    prompts, new = batch["prompts"], batch["new_tokens"]
    chunk = batch.get("logprob_chunk") or new
    chunks = [min(chunk, new)]
    while chunks[-1] // 2 >= 16:
        chunks.append(chunks[-1] // 2)
    start = batch.get("micro_batches", 1)
    micro = [m for m in range(1, prompts + 1) if prompts % m == 0 and m >= start]
    for k in chunks:
        for m in micro:
            plan = memory_plan(shape, **{**batch, "micro_batches": m, "logprob_chunk": k})
            if plan["peak"] <= pool:
                return m, k, plan
    return None


def pool_fraction() -> float:
    """The share of the card JAX's allocator takes: the script sets DEFAULT_POOL before
    the backend starts unless XLA_PYTHON_CLIENT_MEM_FRACTION is set."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or DEFAULT_POOL)


def _g(x: float) -> str:
    return f"{x / GiB:.2f}"


def plan_lines(shape, plan: dict, *, batch: dict, compute: str, param_dtype: str) -> list[str]:
    """The `plan ...` lines (module docstring)."""
    per, ro, ref, up, opt = (plan[k] for k in ("persistent", "rollout", "reference pass",
                                               "update", "optimizer step"))
    tot = plan["totals"]
    cast = f" + {compute} weights {_g(ro['weights'])}" if ro["weights"] else ""
    lines = [(f"plan persistent: params {_g(per['params'])} + AdamW m, v "
              f"{_g(per['adam'])} + reference {_g(per['reference'])} = "
              f"{_g(tot['persistent'])} GiB"),
             (f"plan rollout: KV cache {_g(ro['kv_cache'])} (+ {_g(ro['kv_growth'])} while "
              f"the last cache phase grows it){cast} + sampler logits {_g(ro['logits'])} = "
              f"{_g(tot['rollout'])} GiB")]
    if ref:
        ref_stacked = f" + stacked layers {_g(ref['stacked'])}" if ref["stacked"] else ""
        lines.append(
            f"plan reference pass: {plan['rows']} rows in chunks of {plan['ref_rows']}, "
            f"forward only: logits tile "
            f"{_g(ref['logits'])} + one layer {_g(ref['layer'])} + hidden {_g(ref['hidden'])}"
            f"{cast}{ref_stacked} = {_g(tot['reference pass'])} GiB")
    else:
        lines.append("plan reference pass: none (beta 0, on-policy) = 0.00 GiB")
    acc = f" + accumulator {_g(up['accumulator'])}" if up["accumulator"] else ""
    stacked = f" + stacked layers {_g(up['stacked'])}" if up["stacked"] else ""
    remat = (" (remat off)" if not batch.get("remat", True)
             else f" (without remat {_g(plan['no_remat'])})" if batch.get("scan_layers")
             else " (remat without scan_layers counted as off)")
    lines.append(f"plan update: micro-batch of {plan['micro_rows']} rows: grads "
                 f"{_g(up['grads'])}{acc}{cast}{stacked} + activations "
                 f"{_g(up['activations'])}{remat} + hidden {_g(up['hidden'])} + logits tile "
                 f"4 x {_g(up['logits'] / 4)} = {_g(tot['update'])} GiB")
    lines.append(f"plan optimizer step: grads {_g(opt['grads'])} + new params, m, v "
                 f"{_g(opt['new_state'])} = {_g(tot['optimizer step'])} GiB")
    lines.append(f"plan peak: {_g(plan['peak'])} GiB = persistent {_g(tot['persistent'])} + "
                 f"{plan['peak_phase']} {_g(tot[plan['peak_phase']])}")
    fraction = pool_fraction()
    for name, card in CARDS:
        pool = fraction * card
        head = (f"plan {name}: {card / GiB:.1f} GiB card, pool {100 * fraction:.0f}% = "
                f"{pool / GiB:.1f} GiB: ")
        if plan["peak"] <= pool:
            lines.append(head + f"fits ({100 * plan['peak'] / pool:.0f}% of the pool)")
            continue
        fit = suggest_fit(shape, pool, **batch)
        if fit is None:
            lower = (f" or plan {compute} master weights (--set model.param_dtype={compute})"
                     if param_dtype != compute else "")
            lines.append(head + "does not fit at any micro_batches and logprob chunk >= 16 "
                         f"(persistent + gradients alone {_g(tot['persistent'] + per['params'])}"
                         f" GiB): shard it over several cards (mesh fsdp){lower}")
        else:
            m, k, fitted = fit
            lines.append(head + f"does not fit; fits with micro_batches {m} and logprob "
                                f"chunk {k} (peak {_g(fitted['peak'])} GiB)")
    return lines


def bound_lines(shape, *, flops: dict, sampler: dict, args, compute: str) -> list[str]:
    goal_s = flops["total"] / (GOAL_MFU * args.peak_tflops * 1e12)
    update = (f"bound update: {flops['total'] / 1e12:.0f} TFLOP of model FLOPs per iteration "
              f"({flops['passes']} forward-equivalents; prompts "
              f"{100 * flops['prompt_share']:.0f}%, output head "
              f"{100 * flops['head_share']:.0f}% of a forward); {goal_s:.2f} s at the "
              f"{100 * GOAL_MFU:.0f}% MFU goal of {args.peak_tflops:g} TFLOP/s")
    sampling = (f"bound sampler: {sampler['bound_s']:.3f} s per rollout at {args.hbm_tbps:g} "
                f"TB/s: {sampler['passes']} decode passes reading "
                f"{sampler['step_mean'] / 1e9:.2f} GB on average (weights "
                f"{sampler['weights'] / 1e9:.2f} GB {compute} + KV cache "
                f"{sampler['kv_mean'] / 1e9:.2f} GB), prefill {sampler['prefill_s']:.3f} s; "
                f"the float32 logits add {sampler['logits_per_pass'] / 1e9:.2f} GB per pass "
                f"(not counted); compute alone {sampler['compute_s']:.2f} s at "
                f"{args.peak_tflops:g} TFLOP/s")
    return [update, sampling]


# ---------------------------------------------------------------------------- the run
def apply_sets(config, items) -> None:
    for item in items:
        key, value = item.split("=", 1)
        node = config
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        old = node[leaf]
        if isinstance(old, str):
            node[leaf] = value
        elif old is None:
            try:
                node[leaf] = json.loads(value)
            except json.JSONDecodeError:
                node[leaf] = value
        else:
            node[leaf] = type(old)(json.loads(value))


def _goal(value: float, goal: float) -> str:
    return "met" if value >= goal else "not met"


def _versions() -> str:
    from importlib import metadata

    out = []
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} ?")
    return ", ".join(out)


def _memory(device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # noqa: BLE001  backends without statistics raise or return None
        return None


def time_sampler(config, *, ckpt, data, tokenizer, prompt_len, calls, shape, args,
                 compute) -> tuple[list[str], dict]:
    """The `sampler`, `sampler compute-dtype copy` and `host` lines (module docstring), and
    the first line's figures."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import parallel
    from grpo_jax.models import from_pretrained
    from grpo_jax.rl.rollout import encode_prompts, score_completions
    from grpo_jax.runner.checks import mesh_rules
    from grpo_jax.runner.rewards import resolve_reward_fns
    from grpo_jax.runner.run import mesh_devices
    from grpo_jax.sampling import generate
    from grpo_jax.stages.rl import loop_settings
    from grpo_jax.tasks import apply_template, get_task
    from grpo_jax.training import Policy

    rl, g = config.rl, config.rl.group_size
    task = get_task("gsm8k", data_dir=data)
    examples = [ex for ex in task.examples("train", rl.num_prompts, seed=config.seed)
                for _ in range(g)]
    prompts = [apply_template(ex, template=config.task.template, tokenizer=tokenizer)
               for ex in examples]
    sampling = loop_settings(rl).sampling(types.SimpleNamespace(tokenizer=tokenizer))
    # Placed as the Run places them (a mesh of one device, the run's rules; the key
    # replicated on it; the prompts on the default device as `jnp.asarray` puts them), so
    # the warm-up call finds the rollout's compiled sampler in jit's cache.
    mesh = parallel.make_mesh(config.mesh.shape.to_dict(), devices=mesh_devices(config))
    model, _ = from_pretrained(ckpt, dtype=config.model.dtype,
                               param_dtype=config.model.param_dtype)
    policy, params = Policy.from_model(parallel.shard_model_state(model, mesh,
                                                                  mesh_rules(config)))
    del model
    host = {}
    t0 = time.perf_counter()
    tokens, mask = encode_prompts(tokenizer, prompts, prompt_len=prompt_len)
    host["tokenising"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens, mask = jax.block_until_ready((jnp.asarray(tokens), jnp.asarray(mask)))
    host["to device"] = time.perf_counter() - t0
    key = jax.jit(lambda: jax.random.key(config.seed),
                  out_shardings=parallel.replicated_sharding(mesh))()
    rows = len(prompts)

    def timed(state):
        out = jax.block_until_ready(generate(policy.graphdef, state, tokens, mask,
                                             jax.random.fold_in(key, 0), config=sampling))
        runs = []
        for i in range(calls):
            t0 = time.perf_counter()
            out = jax.block_until_ready(generate(policy.graphdef, state, tokens, mask,
                                                 jax.random.fold_in(key, i + 1),
                                                 config=sampling))
            seconds = time.perf_counter() - t0
            lengths = np.asarray(out.lengths)
            bound = sampler_bound(shape, rows=rows, groups=rows // g, prompt_len=prompt_len,
                                  generated=int(lengths.max()), hbm_tbps=args.hbm_tbps,
                                  peak_tflops=args.peak_tflops,
                                  compute_bytes=jnp.dtype(compute).itemsize)
            runs.append((seconds, int(lengths.sum()), bound["bound_s"]))
        seconds, generated, bound_s = sorted(runs)[len(runs) // 2]
        return out, seconds, generated / seconds, bound_s / seconds

    out, seconds, rate, fraction = timed(policy.state(params))
    lines = [(f"sampler: {calls} calls after a warm-up, prompts on device, "
              f"{config.model.param_dtype} master weights as the rollout passes them: "
              f"{seconds:.3f} s per rollout, {rate:.0f} generated tokens/s, {fraction:.2f} "
              f"of the HBM bound (goal >= {GOAL_BANDWIDTH}: "
              f"{_goal(fraction, GOAL_BANDWIDTH)})")]
    if jnp.dtype(compute) == jnp.dtype(config.model.param_dtype):
        lines.append(f"sampler compute-dtype copy: skipped (master weights are already "
                     f"{compute})")
    else:
        cast = jax.tree.map(lambda x: x.astype(compute)
                            if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
        _, seconds16, rate16, fraction16 = timed(policy.state(cast))
        del cast
        lines.append(f"sampler compute-dtype copy: the weights cast to {compute} once: "
                     f"{seconds16:.3f} s per rollout, {rate16:.0f} generated tokens/s, "
                     f"{fraction16:.2f} of the HBM bound")
    t0 = time.perf_counter()
    out = jax.device_get(out)
    host["to host"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    texts = [tokenizer.decode(np.asarray(out.tokens)[i, :int(out.lengths[i])].tolist())
             for i in range(rows)]
    host["detokenising"] = time.perf_counter() - t0
    weights = dict(rl.rewards.to_dict())
    reward_fns = resolve_reward_fns(types.SimpleNamespace(task=task), weights, section=rl)
    t0 = time.perf_counter()
    score_completions(texts, examples, reward_fns, weights)
    host["scoring"] = time.perf_counter() - t0
    lines.append("host: per rollout: " + ", ".join(f"{k} {v:.3f} s" for k, v in host.items()))
    return lines, {"seconds": seconds, "fraction": fraction}


def build_config(args):
    from configs import gsm8k

    config = gsm8k.get_config("gpu")
    config.task.train_size, config.task.eval_size = 512, 128
    config.stages = "rl"
    config.rl.steps = args.steps
    config.rl.checkpoint_every = 0
    config.rl.rewards = {"accuracy": 1.0, "format": 0.2}
    config.task.prompt_len = args.prompt_len  # 0: measured, as the pipeline measures it
    apply_sets(config, args.set)
    return config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", "--size", dest="model", default=None,
                        help="named shape (default qwen2.5-0.5b; tiny-1m with --dry_run)")
    parser.add_argument("--num_layers", type=int, default=0,
                        help="override the shape's layer count (0 keeps it)")
    parser.add_argument("--steps", type=int, default=None, help="rl iterations (default 4)")
    parser.add_argument("--scratch", default="/tmp/grpo_jax_gpu_bench")
    parser.add_argument("--peak_tflops", type=float, default=989.0,
                        help="dense bf16 peak (H100 / H200 SXM 989, A100 312)")
    parser.add_argument("--hbm_tbps", type=float, default=4.8,
                        help="HBM bandwidth in TB/s (H200 4.8, H100 SXM 3.35, A100 80GB 2.0)")
    parser.add_argument("--sampler_calls", type=int, default=None,
                        help="timed sampler calls after the warm-up (default 3; 1 dry run)")
    parser.add_argument("--prompt_len", type=int, default=0,
                        help="the prompt bucket (task.prompt_len; 0: the longest prompt of "
                             "the script's tokenizer, rounded up to 8)")
    parser.add_argument("--plan_only", action="store_true",
                        help="print the config, plan and bound lines and stop (no GPU)")
    parser.add_argument("--dry_run", action="store_true",
                        help="everything at a tiny size (tiny-1m, 4 x 2 x 8 tokens, 2 steps)")
    parser.add_argument("--force", action="store_true",
                        help="run even where the plan's peak exceeds the device's pool")
    parser.add_argument("--set", action="append", default=[],
                        help="extra config override, e.g. --set rl.num_prompts=32")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.set = list(DRY_RUN_SETS) + args.set
    args.model = args.model or ("tiny-1m" if args.dry_run else "qwen2.5-0.5b")
    if args.dry_run and not args.num_layers:
        args.num_layers = 1
    args.steps = args.steps or (2 if args.dry_run else 4)
    args.sampler_calls = args.sampler_calls or (1 if args.dry_run else 3)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.environ.get("JAX_PLATFORMS", "") != "cpu":  # before the backend starts
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_POOL)
    import jax
    import jax.numpy as jnp

    from grpo_jax import text
    from grpo_jax.runner.inputs import prompt_bucket
    from grpo_jax.stages.rl import settings as rl_settings
    from grpo_jax.tasks import get_task

    config = build_config(args)
    rl, model_cfg = config.rl, config.model
    compute = model_cfg.dtype
    shape = run_shape(args.model, num_layers=args.num_layers, dtype=compute,
                      param_dtype=model_cfg.param_dtype, remat=bool(model_cfg.remat))
    tokenizer = None
    if not args.plan_only or not args.prompt_len:
        data = write_data(args.scratch)
        tokenizer = text.HFTokenizer(write_tokenizer(os.path.join(args.scratch, "tokenizer")))
    prompt_len = args.prompt_len or prompt_bucket(config, get_task("gsm8k", data_dir=data),
                                                  tokenizer)
    algorithm, resolved = rl_settings(rl)  # beta None is the algorithm's default
    reference = resolved.beta != 0.0
    old_policy = (rl.num_iterations * rl.num_minibatches > 1
                  or algorithm.kl_placement == "reward" and reference)
    scan = bool(model_cfg.get("scan_layers", False))
    batch = {"prompts": rl.num_prompts, "group_size": rl.group_size,
             "prompt_len": prompt_len, "new_tokens": rl.max_new_tokens,
             "micro_batches": rl.micro_batches,
             "logprob_chunk": model_cfg.logprob_chunk_size or 0,
             "logprob_chunk_rows": model_cfg.get("logprob_chunk_rows", 0) or 0,
             "remat": bool(model_cfg.remat), "scan_layers": scan, "reference": reference,
             "prepare_pass": reference or old_policy,
             "param_bytes": jnp.dtype(model_cfg.param_dtype).itemsize,
             "compute_bytes": jnp.dtype(compute).itemsize}
    plan = memory_plan(shape, **batch)
    flops = update_model_flops(shape, prompts=rl.num_prompts, group_size=rl.group_size,
                               prompt_len=prompt_len, new_tokens=rl.max_new_tokens,
                               reference=reference, old_policy=old_policy,
                               iterations=rl.num_iterations)
    rows_per_step = rl.num_prompts * rl.group_size
    planned = sampler_bound(shape, rows=rows_per_step, groups=rl.num_prompts,
                            prompt_len=prompt_len, generated=rl.max_new_tokens,
                            hbm_tbps=args.hbm_tbps, peak_tflops=args.peak_tflops,
                            compute_bytes=batch["compute_bytes"])
    chunk = model_cfg.logprob_chunk_size or 0
    chunk_rows = model_cfg.get("logprob_chunk_rows", 0) or 0
    print(f"config: {args.model} ({shape.num_params() / 1e6:.0f}M parameters; compute "
          f"{compute}, master weights {model_cfg.param_dtype}), {rl.num_prompts} prompts x "
          f"{rl.group_size} completions = {rows_per_step} rows, prompt bucket {prompt_len} + "
          f"{rl.max_new_tokens} new tokens, micro_batches {rl.micro_batches}, logprob chunk "
          f"{chunk or 'all'} positions x {chunk_rows or 'all'} rows, remat "
          f"{'on' if model_cfg.remat else 'off'}, scan_layers {'on' if scan else 'off'}, beta "
          f"{resolved.beta:g}", flush=True)
    for line in plan_lines(shape, plan, batch=batch, compute=compute,
                           param_dtype=model_cfg.param_dtype):
        print(line)
    for line in bound_lines(shape, flops=flops, sampler=planned, args=args, compute=compute):
        print(line, flush=True)
    if args.plan_only:
        return 0

    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    device = jax.local_devices()[0]
    stats = _memory(device)
    pool = (stats or {}).get("bytes_limit")
    print(f"device: {device.device_kind} ({device.platform}), {jax.local_device_count()} "
          f"device(s), pool {f'{pool / GiB:.1f}' if pool else 'n/a'} GiB; {_versions()}",
          flush=True)
    if pool and plan["peak"] > pool and not args.force:
        print(f"stopped: the plan's peak {_g(plan['peak'])} GiB exceeds this device's pool of "
              f"{_g(pool)} GiB (see the plan lines; --force runs anyway)", flush=True)
        return 2
    t0 = time.time()
    ckpt, data = write_assets(args.scratch, args.model, args.num_layers)
    print(f"assets: {time.time() - t0:.0f} s, {ckpt}, {data}", flush=True)
    config.model.init_from, config.task.kwargs.data_dir = ckpt, data
    workdir = os.path.join(args.scratch, f"run_{int(time.time())}")
    t0 = time.time()
    train_and_evaluate(config, workdir)
    wall = time.time() - t0
    rows = [r for r in read_metrics(workdir) if r.get("stage") == "rl"]
    gc.collect()

    peak = args.peak_tflops * 1e12
    print("| step | sample s | update s | step s | generated tok/s | update MFU |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        generated = rows_per_step * r["completion_length"]
        print(f"| {r['stage_step']} | {r['sample_time_s']:.2f} | {r['update_time_s']:.2f} | "
              f"{r['step_time_s']:.2f} | {generated / r['sample_time_s']:.0f} | "
              f"{100 * flops['total'] / r['update_time_s'] / peak:.1f}% |")
    steady = rows[1:] or rows
    mean = {k: sum(r[k] for r in steady) / len(steady)
            for k in ("sample_time_s", "update_time_s", "step_time_s", "completion_length")}
    compiling = sum(r.get("compile_time_s", 0.0) for r in rows)
    seq = prompt_len + rl.max_new_tokens
    print(f"iterations: {len(rows)} in {wall:.0f} s wall (compiling {compiling:.1f} s); steady "
          f"state (steps {min(2, len(rows))}..{len(rows)}): sample {mean['sample_time_s']:.2f} s, "
          f"update {mean['update_time_s']:.2f} s, iteration {mean['step_time_s']:.2f} s, "
          f"{rows_per_step * seq / mean['step_time_s']:.0f} tokens/s overall")
    mfu = flops["total"] / mean["update_time_s"] / peak
    print(f"update MFU: {100 * mfu:.1f}% of {args.peak_tflops:g} TFLOP/s "
          f"({flops['total'] / 1e12:.0f} TFLOP in {mean['update_time_s']:.2f} s; goal >= "
          f"{100 * GOAL_MFU:.0f}%: {_goal(mfu, GOAL_MFU)})")
    stats = _memory(device)
    in_use = (stats or {}).get("peak_bytes_in_use")
    print(f"memory after the iterations: peak {_g(in_use) if in_use else 'n/a'} GiB in use "
          f"(plan {_g(plan['peak'])} GiB)", flush=True)

    sampler, measured = time_sampler(config, ckpt=ckpt, data=data, tokenizer=tokenizer,
                                     prompt_len=prompt_len, calls=args.sampler_calls,
                                     shape=shape, args=args, compute=compute)
    for line in sampler:
        print(line, flush=True)
    stats = _memory(device)
    in_use = (stats or {}).get("peak_bytes_in_use")
    print(f"memory at the end: peak {_g(in_use) if in_use else 'n/a'} GiB in use")
    print(f"result: | {device.device_kind} | {args.model} shape | {mean['sample_time_s']:.2f} | "
          f"{mean['update_time_s']:.2f} | "
          f"{rows_per_step * mean['completion_length'] / mean['sample_time_s']:.0f} | "
          f"{100 * mfu:.1f}% | {measured['seconds']:.3f} s, {measured['fraction']:.2f} of bound |",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
