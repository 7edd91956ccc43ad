"""Rollouts and updates on a long-tailed length workload: packed against padded updates (and,
when the sampler has them, continuous against static batching), alternated in one process.

The workload: B = 64 rows (8 prompts x 8 completions) of prompts of 8-16 tokens and
completions whose lengths are long-tailed (lognormal, median 24 tokens, sigma 0.9, clipped
to [4, 192]: most rows short, a few at the budget, the shape of reasoning RL's completions),
printed as percentiles. The model is bench_grpo.py's (hidden 128 or 256, 4 layers, vocab
512).

- `padded_update`: the GRPO update step (`rl.update.make_train_step`: the clipped surrogate
  with beta 0.04 and the entropy term, AdamW) on the [B, P + N] padded batch.
- `packed_update`: the same step on the batch's rows packed into K blocks of P + N tokens
  (`rl.packing`, K = the blocks first-fit needs), which has the padded step's gradient.

tokens_per_s counts the rows' real tokens (prompt and completion) per second of the step;
`fraction` is the step's FLOPs on those tokens (3x a forward) per second over the matmul
chain's fwd+bwd throughput measured in the same run (benchmarks/flops.py).

    JAX_PLATFORMS=cpu python benchmarks/bench_rollouts.py [--hidden 128] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import bench_grpo as grpo  # noqa: E402
import flops  # noqa: E402
from grpo_jax import host_memory  # noqa: E402
from grpo_jax.models import Transformer  # noqa: E402
from grpo_jax.rl.algorithms import ALGORITHMS  # noqa: E402
from grpo_jax.rl.batch import RolloutBatch  # noqa: E402
from grpo_jax.rl.packing import blocks_needed, pack_rows  # noqa: E402
from grpo_jax.rl.update import LossSettings, make_train_step  # noqa: E402
from grpo_jax.training import Policy, init_opt_state, make_optimizer  # noqa: E402

ROWS, PROMPT_LEN, MAX_NEW = 64, 16, 192


def long_tailed_batch(seed: int = 0) -> tuple[RolloutBatch, np.ndarray]:
    """A rollout's layout with long-tailed completion lengths; (batch, lengths)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(24), 0.9, ROWS)), 4, MAX_NEW).astype(int)
    prompts = np.repeat(rng.integers(8, PROMPT_LEN + 1, ROWS // 8), 8)
    width = PROMPT_LEN + MAX_NEW
    tokens = np.full((ROWS, width), grpo.PAD_ID, np.int32)
    mask = np.zeros((ROWS, width), bool)
    loss = np.zeros((ROWS, MAX_NEW), bool)
    for b in range(ROWS):
        p, n = prompts[b], lengths[b]
        tokens[b, PROMPT_LEN - p:PROMPT_LEN + n] = rng.integers(0, grpo.VOCAB - 4, p + n)
        mask[b, PROMPT_LEN - p:PROMPT_LEN + n] = True
        loss[b, :n] = True
    noise = rng.normal(size=(ROWS, MAX_NEW)).astype(np.float32)
    batch = RolloutBatch(
        tokens=tokens, attention_mask=mask, loss_mask=loss, behaviour_logp=noise * 0.1 - 4,
        rewards=rng.normal(size=ROWS).astype(np.float32), version=np.zeros(ROWS, np.int32),
        advantages=np.repeat(rng.normal(size=(ROWS, 1)), MAX_NEW, 1).astype(np.float32),
        old_logp=noise * 0.1 - 4, ref_logp=noise * 0.1 - 4)
    return batch, lengths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    host_memory.reuse_freed_memory()
    config = grpo.model_config(args.hidden).replace(max_seq_len=PROMPT_LEN + MAX_NEW)
    policy, params = Policy.from_model(Transformer(config, rngs=nnx.Rngs(0)))
    batch, lengths = long_tailed_batch()
    real = int(batch.attention_mask.sum())
    width = batch.tokens.shape[1]
    blocks = blocks_needed(batch.attention_mask, width)
    packed = pack_rows(batch.tokens, batch.attention_mask, PROMPT_LEN, num_blocks=blocks,
                       block_len=width, pad_id=grpo.PAD_ID)
    print(f"workload: {ROWS} rows, prompts {PROMPT_LEN} / completions {MAX_NEW} columns; "
          f"completion lengths p10/p50/p90/p99/max = "
          + "/".join(str(int(np.percentile(lengths, q))) for q in (10, 50, 90, 99, 100))
          + f", mean {lengths.mean():.1f}; real tokens {real} of {ROWS * width} padded "
          f"positions ({real / (ROWS * width):.0%}); packed into {blocks} blocks of {width}")
    settings = LossSettings(beta=0.04, entropy_coef=0.001, on_policy=False,
                            objective=ALGORITHMS["grpo"].objective)
    optimizer, _ = make_optimizer(lr=1e-5, steps=1000, warmup_frac=0.0)
    step = make_train_step(policy, optimizer, settings, prompt_len=PROMPT_LEN, micro_batches=1)
    arms = {"padded_update": jax.device_put(batch),
            "packed_update": jax.device_put(batch.replace(packed=packed))}
    state = {}
    for name, arm in arms.items():  # compile both, and keep each arm's own state
        opt_state = init_opt_state(optimizer, params)
        p = jax.tree.map(jnp.copy, params)
        p, opt_state, _ = step(p, opt_state, arm)
        jax.block_until_ready(p)
        state[name] = (p, opt_state)
    times = {name: [] for name in arms}
    for round_ in range(args.rounds):
        for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):
            p, opt_state = state[name]
            start = time.perf_counter()
            p, opt_state, _ = step(p, opt_state, arms[name])
            jax.block_until_ready(p)
            times[name].append(time.perf_counter() - start)
            state[name] = (p, opt_state)
    chain = flops.matmul_flops_per_s(config, 256, backward=True)
    useful = 3 * sum(2 * flops.weights_per_token(config) * int(m.sum())
                     + flops.attention_flops(config, int(m.sum()))
                     for m in batch.attention_mask)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name in arms:
        print(f"mode={name} tokens_per_s={real / median[name]:.0f} step_s={median[name]:.4f} "
              f"fraction={useful / median[name] / chain:.2f} (rounds {min(times[name]):.4f}-"
              f"{max(times[name]):.4f} s)")
    print(f"matmul chain fwd+bwd: {chain / 1e9:.1f} GFLOP/s")
    print(f"packed/padded={median['padded_update'] / median['packed_update']:.2f}")


if __name__ == "__main__":
    main()
