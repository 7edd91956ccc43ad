"""Where a step's time goes: parts of the model swapped for cheap stand-ins, alternated.

Each workload is compiled once as the library runs it ("full") and once per variant in which
one part of the model is replaced by a stand-in that costs almost nothing (measurement only:
the stand-ins compute the wrong function, and the variants' losses and tokens are not the
library's). All programs are then timed in turn, one call each per round, in one process, so
the machine's drift hits them alike. The workloads:

- `pre`: the main job's pretraining step (configs/default.py, tiny-1m, one packed batch of 64
  examples in 31 rows x 64 tokens; forward, backward, clipping, AdamW; two row groups, as the
  stage runs it on this CPU), as in bench_streams;
- `sample128`, `sample256`: one `generate` call of bench_grpo's sampling phase (its
  Qwen2-shaped model at that hidden size, 64 rows of 16-token prompts, 64 new tokens at
  temperature 1, no EOS, 4 cache phases; every row its own prompt, as bench_sampler).

The variants:

- `no attention core`: softmax(q k^T) v replaced by q * (k + v) (the projections, the rotary
  and, in the sampler, the KV-cache writes stay);
- `no rotary`: the rotation is the identity;
- `no norms`: RMSNorm multiplies by its scale only;
- `no SiLU`: the SwiGLU gate is linear;
- `matmuls only`: all four at once, which leaves the dense matmuls, the embedding, the loss
  and the optimizer (or the sampling): the fraction it reaches is about the most this model
  shape gets from XLA:CPU's matmuls inside a whole step.

Fractions are model FLOPs per second (`flops.py`: train_flops / generate_flops) over the
throughput of the matmul chain at the same shapes (`flops.matmul_chain`), which is timed in
the same rounds as the programs (its median against theirs). The variants' fractions count
the full model's FLOPs, so they read as "the fraction the step would reach if that part were
free". With --profile, a `jax.profiler` trace of the full programs is summarised too: op
time by kind of HLO op (joined with the optimized HLO), and how long 0, 1 or 2 traced ops
ran at once.

    JAX_PLATFORMS=cpu python benchmarks/bench_ablation.py [--workloads pre,sample128,sample256]
        [--rounds 20] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import bench_grpo as grpo  # noqa: E402
import flops  # noqa: E402
from bench_streams import alternate, compiled_step, pretraining_step  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.models import from_pretrained, transformer  # noqa: E402
from grpo_jax.sampling import SamplingConfig, sampler  # noqa: E402
from grpo_jax.training import default_batch_streams  # noqa: E402

PROMPTS, PROMPT_LEN, NEW_TOKENS = 64, 16, 64


def _cheap_attention(q, k, v, *_args, **_kwargs):
    """q * (k + v), each KV head's sum repeated for its query heads: [B, T, N, H]."""
    return q * jnp.repeat(k + v, q.shape[2] // k.shape[2], axis=2)


def _cheap_cached_attention(q, cache_k, cache_v, *_args):
    """q times the first slot's key and value (so the cache stays read): [B, T, N, H]."""
    b, t, n, h = q.shape
    kv = (cache_k[:, :, 0] + cache_v[:, 0]).reshape(b, -1, 1, h)  # [B, K, 1, H]
    return q * jnp.repeat(kv, n // kv.shape[1], axis=1).reshape(b, 1, n, h)


def _scale_only(self, x):
    return (x * self.scale[...]).astype(self.dtype)


STAND_INS = {
    "no attention core": lambda: (mock.patch.object(transformer, "attend", _cheap_attention),
                                  mock.patch.object(transformer, "attend_cached",
                                                    _cheap_cached_attention)),
    "no rotary": lambda: (mock.patch.object(transformer, "rotate", lambda x, cos, sin: x),),
    "no norms": lambda: (mock.patch.object(transformer.RMSNorm, "__call__", _scale_only),),
    "no SiLU": lambda: (mock.patch.object(jax.nn, "silu", lambda x: x),),
}
VARIANTS = ["full", *STAND_INS, "matmuls only"]


@contextlib.contextmanager
def swapped(variant: str):
    """The model code with `variant`'s stand-ins in place (traced and compiled inside)."""
    names = list(STAND_INS) if variant == "matmuls only" else (
        [] if variant == "full" else [variant])
    with contextlib.ExitStack() as stack:
        for name in names:
            for patch in STAND_INS[name]():
                stack.enter_context(patch)
        yield


def pretraining_workload():
    """(label, {variant: (call, compiled text)}, model FLOPs per call, the matmul chain at
    the step's shapes: (call, FLOPs per call))."""
    policy, params, optimizer, batch, make = pretraining_step()
    policy = dataclasses.replace(policy, batch_streams=default_batch_streams())  # as the stage
    programs = {}
    for variant in VARIANTS:
        with swapped(variant):
            call, text = compiled_step(make(policy).fn, params, optimizer, batch,
                                       with_text=True)
            jax.block_until_ready(call())
        programs[variant] = (call, text)
    model = nnx.merge(policy.graphdef, policy.template).config
    rows, length = batch.tokens.shape
    work = flops.train_flops(model, rows, length)
    chain = flops.matmul_chain(model, rows * length, backward=True)
    label = f"pretraining step ({rows} x {length} tokens, hidden {model.hidden_size})"
    return label, programs, work, chain


def sampler_workload(hidden: int, tmp: str):
    """The same for one generate call of bench_grpo's model at `hidden`."""
    checkpoint = os.path.join(tmp, f"checkpoint{hidden}")
    grpo.write_checkpoint(checkpoint, hidden)
    model, config = from_pretrained(checkpoint, dtype="float32")
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, config.vocab_size, (PROMPTS, PROMPT_LEN)), jnp.int32)
    mask = jnp.ones(prompts.shape, bool)
    settings = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0)
    programs = {}
    for variant in VARIANTS:
        with swapped(variant):
            # a fresh function per variant, so that no trace is shared between them
            fn = jax.jit(lambda s, p, m, k: sampler._generate_core(graphdef, s, p, m, k,
                                                                   settings))
            compiled = fn.lower(state, prompts, mask, jax.random.key(0)).compile()
        keys = iter(range(1, 10**6))
        call = (lambda compiled=compiled, keys=keys:
                compiled(state, prompts, mask, jax.random.key(next(keys))).tokens)
        jax.block_until_ready(call())
        programs[variant] = (call, compiled.as_text())
    work = flops.generate_flops(config, PROMPTS, PROMPT_LEN, NEW_TOKENS)
    chain = flops.matmul_chain(config, PROMPTS)
    label = f"sampler, batch {PROMPTS}, hidden {hidden}"
    return label, programs, work, chain


def profile_summary(call, hlo_text: str, calls: int = 5) -> None:
    """Prints op time by kind and the time at each number of concurrently running ops,
    from a `jax.profiler` trace of `calls` calls."""
    shapes = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ", line)
        if m:
            op = re.search(r'op_name="([^"]+)"', line)
            shapes[m.group(1)] = (m.group(2), op.group(1) if op else "")
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(call())
        path = glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)[0]
        events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    containers = ("while", "call", "conditional")  # their events hold their bodies' ops
    ops = [e for e in events if e["name"] in shapes
           and not re.sub(r"\.\d+$", "", e["name"]).startswith(containers)]
    by_kind = collections.Counter()
    for e in ops:
        shape, op_name = shapes[e["name"]]
        dims = re.search(r"\[([^\]]*)\]", shape)
        rank = len(dims.group(1).split(",")) if dims and dims.group(1) else 0
        if "dot_general" in op_name or e["name"].startswith("dot"):
            kind = "dense matmul (2-D)" if rank == 2 else "batched matmul (attention)"
        else:
            kind = re.sub(r"\.\d+$", "", e["name"])
        by_kind[kind] += e["dur"]
    total = sum(by_kind.values())
    print(f"    op time summed over threads: {total / calls / 1e3:.1f} ms per call "
          f"({len(ops) // calls} ops)")
    for kind, us in by_kind.most_common(8):
        print(f"      {us / calls / 1e3:7.2f} ms  {kind}")
    # concurrency inside the longest top-level executions (one per call)
    runs = sorted((e for e in events if e["name"].startswith("ThunkExecutor::Execute (wait")),
                  key=lambda e: -e["dur"])[:calls]
    level_time = collections.Counter()
    for run in runs:
        start, end = run["ts"], run["ts"] + run["dur"]
        points = sorted(p for e in ops if start <= e["ts"] < end
                        for p in ((e["ts"], 1), (e["ts"] + e["dur"], -1)))
        level, last = 0, start
        for t, step in points:
            level_time[min(level, 2)] += t - last
            level, last = level + step, t
        level_time[0] += end - last
    span = sum(level_time.values()) or 1
    print("    share of the call with 0 / 1 / 2+ traced ops running: "
          + " / ".join(f"{level_time[k] / span:.2f}" for k in (0, 1, 2))
          + " (matmuls on the intra-op pool and waits show as 0)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="pre,sample128,sample256")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    host_memory.reuse_freed_memory()  # as the main job runs
    print(f"jax {jax.__version__}, cpu_count {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        workloads = [pretraining_workload() if name == "pre" else
                     sampler_workload(int(name.removeprefix("sample")), tmp)
                     for name in args.workloads.split(",")]
        calls = [(label, variant, call, []) for label, programs, _, chain in workloads
                 for variant, (call, _) in [*programs.items(), ("chain", chain)]]
        alternate(calls, args.rounds)
        medians = {(label, variant): statistics.median(times)
                   for label, variant, _, times in calls}
        for label, programs, work, (_, chain_flops) in workloads:
            full = medians[label, "full"]
            peak = chain_flops / medians[label, "chain"]
            print(f"\n{label}: matmul chain {peak / 1e9:.1f} GFLOP/s at these shapes; medians "
                  f"of {args.rounds} rounds alternating all of this run's programs and chains")
            print("| variant | ms | / full | fraction of the matmul throughput |")
            print("|---|---|---|---|")
            for variant in programs:
                t = medians[label, variant]
                print(f"| {variant} | {t * 1e3:.1f} | {t / full:.3f} | {work / t / peak:.2f} |")
            if args.profile:
                call, text = programs["full"]
                profile_summary(call, text)


if __name__ == "__main__":
    main()
