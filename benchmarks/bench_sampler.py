"""Sampler throughput: grpo_jax.sampling.generate vs transformers' generate(), same weights.

A Qwen2-shaped model of about 3M parameters (hidden 256, 4 layers, 4 heads, 2 KV heads,
MLP 688, vocab 512) is created at random with transformers, saved as safetensors to a
temporary directory and loaded through grpo_jax's importer, so both samplers run the same
weights. 16-token prompts, 64 new tokens (no EOS), plain sampling at temperature 1, batch 1
and 64, on CPU; timed calls of the two samplers and of the model's matmul chain at the
decode step's shapes (`flops.matmul_chain`, weights as arguments as the sampler's are)
alternate in rounds. Reports generated tokens/s, the ratio, the model FLOP/s reached
(`flops.generate_flops`) as a fraction of the chain's throughput, and the matmul-bound ratio:
the ratio to the peer that a sampler doing nothing but the model's matmuls at that throughput
would reach.

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

import flops
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


def timed_rounds(calls, repeats: int) -> list[float]:
    """Median seconds of each call over `repeats` rounds; each round runs them in turn.

    Rounds interleave the calls, so a change in machine load hits all of them. Within a round
    each first runs once untimed: that call absorbs what the one before left behind (the
    other library's data in the caches, torch's OpenMP workers still spinning) and the second
    is timed.
    """
    times = [[] for _ in calls]
    for _ in range(repeats):
        for fn, fn_times in zip(calls, times):
            fn()  # settle (and, in the first round, compile)
            start = time.perf_counter()
            fn()
            fn_times.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


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

        chain, chain_flops = flops.matmul_chain(config, batch)
        ours_s, theirs_s, chain_s = timed_rounds((ours, theirs, chain), args.repeats)
        peak = chain_flops / chain_s
        work = flops.generate_flops(config, batch, PROMPT_LEN, NEW_TOKENS)
        tokens = batch * NEW_TOKENS
        row = dict(
            batch=batch,
            ours_tok_s=tokens / ours_s,
            hf_tok_s=tokens / theirs_s,
            ratio=theirs_s / ours_s,
            matmul_gflops=peak / 1e9,
            ours_fraction=work / ours_s / peak,
            hf_fraction=work / theirs_s / peak,
            # the ratio a sampler doing nothing but the model's matmuls at `peak` would reach
            bound=theirs_s / (work / peak),
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
