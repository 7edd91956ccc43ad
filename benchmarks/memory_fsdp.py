"""Per-device parameter + optimizer-state bytes of the GRPO train step under fsdp = 1, 2, 4, 8.

Abstract shapes only (no weights are created): the Qwen2.5-0.5B shape in float32 (master
weights) with AdamW, its parameters sharded by the run's logical axis rules over a mesh of
`fsdp` devices, the GRPO train step (`grpo_jax.rl.update.make_train_step`, bfloat16
compute, remat) lowered and compiled for those shardings, and XLA's memory analysis of the
compiled program: the bytes of its parameter and optimizer-state arguments on one device,
against the ideal total / fsdp.

    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python benchmarks/memory_fsdp.py [--size qwen2.5-0.5b] [--rows 8 --seq 256]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
# Only the memory plan is wanted: skip LLVM's optimisation passes (the buffer assignment and
# the argument sizes do not depend on them; compiling 24 layers on 2 cores takes minutes).
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"


def _bytes(tree) -> int:
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of `tree` (ShapeDtypeStructs with shardings)."""
    import math

    import jax

    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape)
        total += math.prod(shard) * x.dtype.itemsize
    return total


def measure(size: str, fsdp: int, rows: int, seq: int, compile_step: bool = True) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from grpo_jax import parallel
    from grpo_jax.models import Transformer, named_config
    from grpo_jax.rl.batch import RolloutBatch
    from grpo_jax.rl.update import LossSettings, make_train_step
    from grpo_jax.training import Policy, make_optimizer

    config = named_config(size, dtype="bfloat16", param_dtype="float32", remat=True)
    mesh = parallel.make_mesh({"data": 1, "fsdp": fsdp, "tensor": 1},
                              devices=jax.devices()[:fsdp])
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = parallel.state_shardings(state, mesh, parallel.DEFAULT_RULES)
    policy = Policy(graphdef, state, 256)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nnx.to_pure_dict(state), nnx.to_pure_dict(shardings))
    optimizer, _ = make_optimizer(lr=1e-6, steps=100)
    opt_abstract = jax.eval_shape(optimizer.init, params)
    replicated = parallel.replicated_sharding(mesh)
    opt_state = _mirror(opt_abstract, params, replicated)
    data = parallel.data_sharding(mesh)
    prompt = seq // 2
    new = seq - prompt
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=data)  # noqa: E731
    batch = RolloutBatch(
        tokens=spec((rows, seq), jnp.int32), attention_mask=spec((rows, seq), jnp.bool_),
        loss_mask=spec((rows, new), jnp.bool_), behaviour_logp=spec((rows, new), jnp.float32),
        rewards=spec((rows,), jnp.float32), version=spec((rows,), jnp.int32),
        advantages=spec((rows, new), jnp.float32), ref_logp=spec((rows, new), jnp.float32))
    state_bytes = _bytes(params) + _bytes(opt_state)
    figures = {"fsdp": fsdp, "params_total": _bytes(params), "state_total": state_bytes,
               "ideal": state_bytes / fsdp,
               "sharded": _per_device_bytes(params) + _per_device_bytes(opt_state)}
    if not compile_step:
        return figures
    step = make_train_step(policy, optimizer, LossSettings(beta=0.04), prompt_len=prompt,
                           micro_batches=1)
    t0 = time.time()
    out_shardings = (jax.tree.map(lambda x: x.sharding, params),
                     jax.tree.map(lambda x: x.sharding, opt_state), None)
    compiled = jax.jit(step.fn, out_shardings=out_shardings, donate_argnums=(0, 1)).lower(
        params, opt_state, batch).compile()
    analysis = compiled.memory_analysis()
    batch_bytes = _per_device_bytes(batch)
    return {**figures,
            "compiled_arguments": analysis.argument_size_in_bytes - batch_bytes,
            "temp": analysis.temp_size_in_bytes,
            "compile_s": time.time() - t0}


def _mirror(opt_abstract, params, replicated):
    """Optimizer-state leaves with the sharding of the parameter they mirror (optax keeps
    mu / nu in the parameters' tree structure), scalars replicated."""
    import jax

    param_def = jax.tree.structure(params)

    def place(node):
        try:
            if jax.tree.structure(node) == param_def:
                return jax.tree.map(
                    lambda x, p: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=p.sharding),
                    node, params)
        except Exception:  # noqa: BLE001
            pass
        return None

    def walk(node):
        placed = place(node)
        if placed is not None:
            return placed
        if isinstance(node, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(node.shape, node.dtype, sharding=replicated)
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return type(node)(*[walk(c) for c in node])
        if isinstance(node, (tuple, list)):
            return type(node)(walk(c) for c in node)
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    return walk(opt_abstract)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="qwen2.5-0.5b")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--fsdp", default="1,2,4,8")
    parser.add_argument("--no_compile", action="store_true",
                        help="only the per-device bytes of the shardings (no compile)")
    args = parser.parse_args()
    gib = 2**30
    print(f"{args.size}, float32 parameters + AdamW (mu, nu), batch {args.rows} x {args.seq}")
    print("| fsdp | params + optimizer state, total GiB | ideal per device (total / fsdp) GiB "
          "| per device, from the shardings GiB | per device, compiled step's arguments GiB "
          "| ratio to ideal | compile s |")
    print("|---|---|---|---|---|---|---|")
    for fsdp in [int(f) for f in args.fsdp.split(",")]:
        m = measure(args.size, fsdp, args.rows, args.seq, compile_step=not args.no_compile)
        compiled = m.get("compiled_arguments")
        print(f"| {fsdp} | {m['state_total'] / gib:.3f} | {m['ideal'] / gib:.3f} | "
              f"{m['sharded'] / gib:.3f} | "
              + (f"{compiled / gib:.3f} | {compiled / m['ideal']:.3f} | "
                 f"{m['compile_s']:.0f} |" if compiled is not None else
                 f"- | {m['sharded'] / m['ideal']:.3f} (shardings) | - |"), flush=True)


if __name__ == "__main__":
    main()
