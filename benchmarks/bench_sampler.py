"""Sampler throughput: grpo_jax.sampling.generate vs transformers' generate(), same weights.

A Qwen2-shaped model of about 3M parameters (hidden 256, 4 layers, 4 heads, 2 KV heads,
MLP 688, vocab 512) is created at random with transformers, saved as safetensors to a
temporary directory and loaded through grpo_jax's importer, so both samplers run the same
weights. 16-token prompts, 64 new tokens (no EOS), plain sampling at temperature 1, batch 1
and 64, on CPU; timed calls of the two samplers alternate in rounds. Reports generated
tokens/s, the ratio, the model FLOP/s reached as a fraction of the matmul throughput measured
by this script at the decode step's shapes, and the matmul-bound ratio: the ratio to the peer
that a sampler doing nothing but the model's matmuls at that throughput would reach.

    JAX_PLATFORMS=cpu python benchmarks/bench_sampler.py [--repeats 5] [--batches 1,64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from grpo_jax import host_memory
from grpo_jax.models import from_pretrained
from grpo_jax.sampling import SamplingConfig, generate

SHAPE = dict(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=688,
    max_position_embeddings=256,
)
PROMPT_LEN, NEW_TOKENS = 16, 64


def decode_matmul_flops(config, batch: int) -> int:
    """2 * B * (weights touched by one decode step's matmuls), output head included."""
    d, n, k, h, f = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_size,
    )
    per_layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
    return 2 * batch * (config.num_layers * per_layer + d * config.vocab_size)


def generate_flops(config, batch: int) -> int:
    """Model FLOPs of one generate call: prefill + decode matmuls + attention scores/values."""
    matmul = decode_matmul_flops(config, 1) // 2  # weights per token
    tokens = PROMPT_LEN + NEW_TOKENS
    flops = 2 * matmul * batch * tokens  # every prompt and generated position
    attention = 0
    for position in range(tokens):  # q.k and p.v over the causal context
        attention += 4 * config.num_layers * config.num_heads * config.head_dim * (position + 1)
    return flops + batch * attention


def measured_matmul_flops_per_s(config, batch: int, iters: int = 200) -> float:
    """FLOP/s of a chain of matmuls with exactly the decode step's shapes, in one XLA loop."""
    d, n, k, h, f = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.mlp_size,
    )
    key = jax.random.key(0)
    ks = jax.random.split(key, 5)
    w_qkv = jax.random.normal(ks[0], (config.num_layers, d, (n + 2 * k) * h)) * 0.05
    w_o = jax.random.normal(ks[1], (config.num_layers, n * h, d)) * 0.05
    w_gu = jax.random.normal(ks[2], (config.num_layers, d, 2 * f)) * 0.05
    w_down = jax.random.normal(ks[3], (config.num_layers, f, d)) * 0.05
    w_head = jax.random.normal(ks[4], (d, config.vocab_size)) * 0.05
    x0 = jnp.ones((batch, d))

    @jax.jit
    def chain(x):
        def one_step(_, x):
            for layer in range(config.num_layers):
                qkv = x @ w_qkv[layer]
                x = qkv[:, : n * h] @ w_o[layer]
                gu = x @ w_gu[layer]
                x = gu[:, :f] @ w_down[layer]
            logits = x @ w_head
            return x + 1e-3 * logits[:, :1]

        return jax.lax.fori_loop(0, iters, one_step, x)

    chain(x0).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        chain(x0).block_until_ready()
        times.append(time.perf_counter() - start)
    return decode_matmul_flops(config, batch) * iters / min(times)


def timed_pair(ours, theirs, repeats: int) -> tuple[float, float]:
    """Median seconds of each over `repeats` rounds; each round runs ours then theirs.

    Rounds interleave the two, so a change in machine load hits both. Within a round each
    sampler first runs once untimed: that call absorbs what the other library left behind
    (its data in the caches, torch's OpenMP workers still spinning) and the second is timed.
    """
    ours_s, theirs_s = [], []
    for _ in range(repeats):
        for fn, times in ((ours, ours_s), (theirs, theirs_s)):
            fn()  # settle (and, in the first round, compile)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(ours_s), statistics.median(theirs_s)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--malloc", choices=("reuse", "system"), default="reuse",
                        help="reuse: glibc malloc keeps freed memory (grpo_jax.host_memory) in "
                             "this process, for both samplers; system: the allocator's defaults")
    args = parser.parse_args()
    if args.malloc == "reuse":
        host_memory.reuse_freed_memory()  # before the backend starts its threads
    print(f"malloc {args.malloc}")
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE)).float().eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model, config = from_pretrained(tmp, dtype="float32")
    graphdef, state = nnx.split(model)
    print(
        f"devices: jax {jax.devices()[0].platform} x{len(jax.devices())}, torch threads "
        f"{torch.get_num_threads()}, cpu_count {os.cpu_count()}"
    )
    print(
        f"model: {config.num_params():,} parameters ({config.num_layers} layers, hidden "
        f"{config.hidden_size}, heads {config.num_heads}/{config.num_kv_heads}, mlp "
        f"{config.mlp_size}, vocab {config.vocab_size}); prompt {PROMPT_LEN}, new {NEW_TOKENS}"
    )
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        rng = np.random.default_rng(batch)
        prompts = rng.integers(0, config.vocab_size, (batch, PROMPT_LEN)).astype(np.int32)
        mask = np.ones_like(prompts, bool)
        jax_prompts, jax_mask = jnp.asarray(prompts), jnp.asarray(mask)
        keys = iter(range(10**6))

        def ours():
            out = generate(
                graphdef, state, jax_prompts, jax_mask, jax.random.key(next(keys)), config=sampling
            )
            out.tokens.block_until_ready()
            assert int(out.lengths.sum()) == batch * NEW_TOKENS

        torch_prompts, torch_mask = (
            torch.tensor(prompts, dtype=torch.long),
            torch.tensor(mask.astype(int)),
        )

        def theirs():
            with torch.no_grad():
                out = hf_model.generate(
                    input_ids=torch_prompts,
                    attention_mask=torch_mask,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            assert out.shape == (batch, PROMPT_LEN + NEW_TOKENS)

        ours_s, theirs_s = timed_pair(ours, theirs, args.repeats)
        peak = measured_matmul_flops_per_s(config, batch)
        flops = generate_flops(config, batch)
        tokens = batch * NEW_TOKENS
        row = dict(
            batch=batch,
            ours_tok_s=tokens / ours_s,
            hf_tok_s=tokens / theirs_s,
            ratio=theirs_s / ours_s,
            matmul_gflops=peak / 1e9,
            ours_fraction=flops / ours_s / peak,
            hf_fraction=flops / theirs_s / peak,
            # the ratio a sampler doing nothing but the model's matmuls at `peak` would reach
            bound=theirs_s / (flops / peak),
        )
        rows.append(row)
        print(
            f"batch {batch:3d}: ours {row['ours_tok_s']:10.0f} tok/s | transformers "
            f"{row['hf_tok_s']:8.0f} tok/s | ratio {row['ratio']:6.1f}x | matmul at decode "
            f"shapes {row['matmul_gflops']:6.1f} GFLOP/s | model FLOP/s fraction: ours "
            f"{row['ours_fraction']:.2f}, transformers {row['hf_fraction']:.3f} | matmul-bound "
            f"ratio {row['bound']:.1f}x",
            flush=True,
        )
    print(
        "\n| batch | grpo_jax tok/s | transformers tok/s | ratio | matmul GFLOP/s at decode "
        "shapes | grpo_jax fraction | transformers fraction | matmul-bound ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['ours_tok_s']:.0f} | {r['hf_tok_s']:.0f} | {r['ratio']:.1f}x | "
            f"{r['matmul_gflops']:.1f} | {r['ours_fraction']:.2f} | {r['hf_fraction']:.3f} | "
            f"{r['bound']:.1f}x |"
        )


if __name__ == "__main__":
    main()
