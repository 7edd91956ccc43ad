"""The main job's pretraining step as a fraction of the matmul throughput at its shapes.

Runs the pretrain stage of configs/default.py (tiny-1m, 64 examples per step, the char
tokenizer, on the main job's corpus) for --steps steps through `grpo_jax.pipeline`, takes
the median `step_time_s` after the first --skip steps (compilation is logged apart and
excluded), and divides the model FLOP/s of the rows the step computes (forward + backward;
`flops.train_flops`) by the throughput of the model's matmul chain with its backward at
that many rows, measured in the same run. The rows: with pretrain.pack_len (the main job
packs into rows of 64 tokens) as many as the stage packs each step into; with
--pack_len 0, one example per row at the longest row rounded up to 8 (40 tokens).

    JAX_PLATFORMS=cpu python benchmarks/bench_pretrain.py [--steps 40] [--pack_len 0] [--malloc system]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import flops  # noqa: E402
from grpo_jax.config_presets import main_job  # noqa: E402
from grpo_jax import host_memory, tasks  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402
from grpo_jax.pipeline import train_and_evaluate  # noqa: E402
from grpo_jax.runner.model_init import model_config_for  # noqa: E402
from grpo_jax.runner.tokenizers import build_tokenizer  # noqa: E402
from grpo_jax.sft.data import encode_pairs, epoch_batches, packed_rows_for  # noqa: E402
from grpo_jax.stages.supervised import pretraining_corpus  # noqa: E402


def main_job_corpus(config, rows: int):
    """The tokenizer and the (prompts, completions) the main job's pretrain stage trains on."""
    task = tasks.get_task(config.task.name, **config.task.kwargs.to_dict())
    tokenizer = build_tokenizer(config, task, None)
    run = types.SimpleNamespace(task=task, config=config, tokenizer=tokenizer)
    return (tokenizer, *pretraining_corpus(run, rows, seed=config.seed))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--pack_len", type=int, default=None,
                        help="pretrain.pack_len (default: the main job's; 0: unpacked rows)")
    parser.add_argument("--compare_packing", type=int, default=0, metavar="ROUNDS",
                        help="instead: the step on one batch packed and unpacked, alternated "
                             "for ROUNDS rounds in this process")
    parser.add_argument("--malloc", choices=("reuse", "system"), default="reuse",
                        help="reuse: glibc malloc keeps freed memory (grpo_jax.host_memory, the "
                             "main job's default); system: the allocator's defaults")
    args = parser.parse_args()
    config = main_job()
    config.reuse_host_memory = args.malloc == "reuse"
    if config.reuse_host_memory:
        host_memory.reuse_freed_memory()  # before the backend starts its threads
    print(f"malloc {args.malloc}")
    if args.compare_packing:
        return compare_packing(config, args.compare_packing)
    if args.pack_len is not None:
        config.pretrain.pack_len = args.pack_len
    full = config.pretrain.steps * config.pretrain.batch_size
    config.stages = "pretrain"
    config.pretrain.steps = args.steps
    config.pretrain.corpus_size = full  # the main job's rows, so its row length
    config.compilation_cache_dir = ""
    tokenizer, prompts, completions = main_job_corpus(config, full)
    model = model_config_for(config, tokenizer.vocab_size)
    pack_len = config.pretrain.pack_len
    data = encode_pairs(tokenizer, prompts, completions, seq_len=pack_len or None,
                        max_len=config.model.max_seq_len, loss_on_prompt=True)
    batch, length = config.pretrain.batch_size, data.tokens.shape[1]
    if pack_len:  # the rows the stage packs each step's examples into (runner.supervised)
        lengths = data.attention_mask.sum(axis=1)
        batches = (epoch_batches(len(lengths), config.pretrain.batch_size, step,
                                 seed=config.seed) for step in range(args.steps))
        batch = packed_rows_for(lengths, batches, pack_len, multiple=jax.device_count())
    with tempfile.TemporaryDirectory() as workdir:
        train_and_evaluate(config, workdir)
        rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    step = statistics.median(r["step_time_s"] for r in rows[args.skip:])
    work = flops.train_flops(model, batch, length)
    peak = flops.matmul_flops_per_s(model, batch * length, backward=True)
    print(f"jax {jax.__version__}, cpu_count {os.cpu_count()}; {config.model.name}: hidden "
          f"{model.hidden_size}, {model.num_layers} layers, vocab {model.vocab_size}; "
          f"{config.pretrain.batch_size} examples per step in {batch} x {length} tokens "
          f"({'packed' if pack_len else 'one example per row'})")
    print(f"pretrain step {step * 1e3:.1f} ms (median of {len(rows) - args.skip}), "
          f"compile {rows[0]['compile_time_s']:.1f} s; model {work / step / 1e9:.1f} GFLOP/s "
          f"of {peak / 1e9:.1f} GFLOP/s matmul (fwd+bwd at {batch * length} rows): "
          f"fraction {work / step / peak:.2f}")


def compare_packing(config, rounds: int) -> None:
    """Median seconds of the supervised step on the main job's first batch, one example per
    row against packed into rows of pretrain.pack_len, the two alternated in one process."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from grpo_jax.models import Transformer
    from grpo_jax.sft.data import pack_rows
    from grpo_jax.sft.loss import make_supervised_step
    from grpo_jax.training import Policy, init_opt_state, make_optimizer

    pack_len, size = config.pretrain.pack_len or config.model.max_seq_len, \
        config.pretrain.batch_size
    tokenizer, prompts, completions = main_job_corpus(config, config.pretrain.steps * size)
    rows = epoch_batches(len(prompts), size, 0, seed=config.seed)
    pick = lambda xs: [xs[i] for i in rows]
    unpacked = encode_pairs(tokenizer, pick(prompts), pick(completions),
                            max_len=config.model.max_seq_len, loss_on_prompt=True)
    padded = encode_pairs(tokenizer, pick(prompts), pick(completions), seq_len=pack_len,
                          loss_on_prompt=True)
    lengths = padded.attention_mask.sum(axis=1)
    packed = pack_rows(padded, packed_rows_for(lengths, [np.arange(size)], pack_len,
                                               multiple=jax.device_count()))
    model = model_config_for(config, tokenizer.vocab_size)
    policy, params = Policy.from_model(Transformer(model, rngs=nnx.Rngs(0)))
    optimizer, _ = make_optimizer(lr=config.pretrain.lr, steps=config.pretrain.steps)
    steps, times = {}, {}
    for name, batch in (("one example per row", unpacked), ("packed", packed)):
        step = make_supervised_step(policy, optimizer)
        state = [jax.tree.map(jnp.copy, params), init_opt_state(optimizer, params)]
        batch = jax.device_put(batch)

        def call(step=step, state=state, batch=batch):
            state[0], state[1], metrics = step(state[0], state[1], batch)
            return metrics

        for _ in range(3):
            jax.block_until_ready(call())
        steps[name], times[name] = (call, batch.tokens.shape), []
    for _ in range(rounds):
        for name, (call, _) in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    median = {name: float(np.median(t)) for name, t in times.items()}
    for name, (_, shape) in steps.items():
        print(f"{name:20s} {shape[0]:3d} x {shape[1]:3d} tokens: step "
              f"{median[name] * 1e3:6.1f} ms (median of {rounds})")
    print(f"packed / one example per row: {median['packed'] / median['one example per row']:.3f}"
          f" ({size} examples, {unpacked['attention_mask'].sum()} tokens)")


if __name__ == "__main__":
    main()
