"""What a TRPO step costs, and where: Fisher-vector products two ways, the Fisher subsampled.

The workload is trpo_vs_ppo's TRPO arm at its shapes (tiny-1m, one rollout batch of 256 rows:
16-token prompts, 40 completion tokens of 5-40 valid, group-normalised advantages over groups
of 8), with random parameters (the cost does not depend on them). Programs, each jitted once
and then timed in turn, one call each per round, in one process (so the machine's drift hits
them alike):

- `gradient`: the gradient of the token-mean surrogate (a forward and a backward);
- `CG, forward-over-reverse`: 10 conjugate-gradient iterations, each product the Hessian of
  the mean KL times v by `jax.jvp` of `jax.grad` (`losses.fisher_vector_product`);
- `CG, Gauss-Newton`: the same 10 iterations on `losses.categorical_fisher_operator`, the
  network linearised once (its cost included) and each product a Jacobian-vector and a
  transposed product;
- `step, fisher_fraction=F`: the library's whole step (`rl.trpo.make_trpo_step`: gradient,
  conjugate gradient, line search, metrics) with the products on that fraction of the rows.

Printed: the median seconds over the rounds, each program's median in gradients (its time
over the gradient's in the same rounds), the two CG solutions' relative difference (the
same products, so about float32 rounding), and the gradient's model FLOPs over the matmul
chain's throughput at its shapes (`flops.py`), timed in the same rounds.

    JAX_PLATFORMS=cpu python benchmarks/bench_trpo.py [--rounds 5] [--fractions 1.0,0.2,0.1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import flops  # the script's folder is on the path
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax import losses
from grpo_jax.models import Transformer, named_config
from grpo_jax.rl import trpo
from grpo_jax.rl.rollout import Rollout
from grpo_jax.training import Policy

ROWS, PROMPT, NEW, GROUP = 256, 16, 40, 8


def workload():
    config = named_config("tiny-1m", max_seq_len=64)
    policy, params = Policy.from_model(Transformer(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, config.vocab_size, (ROWS, PROMPT + NEW)), jnp.int32)
    lengths = rng.integers(5, NEW + 1, ROWS)
    mask = jnp.asarray(np.arange(NEW)[None] < lengths[:, None])
    rewards = jnp.asarray(rng.integers(0, 2, ROWS), jnp.float32)
    batch = Rollout(prompt_tokens=tokens[:, :PROMPT], prompt_mask=jnp.ones((ROWS, PROMPT), bool),
                    tokens=tokens[:, PROMPT:], attention_mask=mask, loss_mask=mask,
                    behaviour_logp=jnp.zeros((ROWS, NEW), jnp.float32), rewards=rewards,
                    version=0).to_batch()
    batch = batch.with_advantages(losses.group_advantages(rewards, group_size=GROUP))
    return config, policy, params, batch


def programs(policy, batch, fractions):
    mask = batch.loss_mask
    weights = mask.astype(jnp.float32) / jnp.sum(mask)

    def logits_fn(p):
        return trpo.completion_logits(policy, p, batch.tokens, batch.attention_mask, PROMPT)

    @jax.jit
    def gradient(params):
        surrogate, _ = trpo.trpo_objectives(policy, params, batch, prompt_len=PROMPT)
        return jax.grad(surrogate)(params)

    @jax.jit
    def cg_reverse(params, g):
        _, mean_kl = trpo.trpo_objectives(policy, params, batch, prompt_len=PROMPT)
        return losses.conjugate_gradient(
            lambda v: losses.fisher_vector_product(mean_kl, params, v, damping=0.1), g,
            iters=10)

    @jax.jit
    def cg_gauss_newton(params, g):
        fvp, _ = losses.categorical_fisher_operator(logits_fn, params, weights, damping=0.1)
        return losses.conjugate_gradient(fvp, g, iters=10)

    steps = {f"step, fisher_fraction={f}": trpo.make_trpo_step(
        policy, prompt_len=PROMPT, max_kl=0.01, damping=0.1, cg_iters=10, fisher_fraction=f)
        for f in fractions}
    return gradient, cg_reverse, cg_gauss_newton, steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fractions", default="1.0,0.2,0.1")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    config, policy, params, batch = workload()
    gradient, cg_reverse, cg_gauss_newton, steps = programs(policy, batch, fractions)
    g = gradient(params)
    chain, chain_flops = flops.matmul_chain(config, ROWS * (PROMPT + NEW), backward=True)
    calls = {"gradient": lambda: gradient(params),
             "CG, forward-over-reverse": lambda: cg_reverse(params, g),
             "CG, Gauss-Newton": lambda: cg_gauss_newton(params, g),
             **{name: (lambda s=s: s(params, batch)) for name, s in steps.items()},
             "matmul chain": chain}
    for call in calls.values():  # compile
        jax.block_until_ready(call())
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            t = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - t)
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(cg_reverse(params, g))])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(cg_gauss_newton(params, g))])
    print(f"TRPO step at trpo_vs_ppo's shapes ({ROWS} rows x {PROMPT}+{NEW} tokens, tiny-1m), "
          f"{args.rounds} rounds, {jax.device_count()} {jax.devices()[0].platform} device(s)")
    grad_median = statistics.median(times["gradient"])
    print("| program | median s | in gradients |")
    print("|---|---:|---:|")
    for name in calls:
        if name == "matmul chain":
            continue
        median = statistics.median(times[name])
        print(f"| {name} | {median:.3f} | {median / grad_median:.2f} |")
    ratio = statistics.median(
        [r / n for r, n in zip(times["CG, forward-over-reverse"], times["CG, Gauss-Newton"])])
    print(f"CG forward-over-reverse / Gauss-Newton, median of per-round ratios: {ratio:.2f}x")
    print(f"CG solutions' relative difference: {np.linalg.norm(a - b) / np.linalg.norm(a):.1e}")
    throughput = chain_flops / statistics.median(times["matmul chain"])
    model = flops.train_flops(config, ROWS, PROMPT + NEW) / grad_median
    print(f"gradient: {model / 1e9:.1f} GFLOP/s of model FLOPs, {model / throughput:.2f} of the "
          f"matmul chain's {throughput / 1e9:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
