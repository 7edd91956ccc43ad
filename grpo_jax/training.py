"""Pieces shared by every training stage: the policy as pure pytrees, AdamW, accumulation.

The trainer keeps parameters as a plain nested dict of arrays (`nnx.to_pure_dict`), so the
jitted step functions are ordinary `jax.jit` functions of pytrees and checkpoints are plain
trees. `Policy` holds the NNX graph definition and a template state to rebuild the module
inside a trace.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

Params = Any  # nested dict of arrays


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """A model's static half: graph definition and a template state (values unused)."""

    graphdef: Any
    template: Any  # nnx.State with the model's full structure
    # Sequence chunk of the output head in teacher-forced log-probs (None: all positions at
    # once). Set it for large vocabularies so [B, T, V] float32 logits never exist at once.
    logprob_chunk_size: int | None = None
    # Row groups of each (micro-)batch whose gradients the update steps compute side by side
    # in one program (`accumulate_gradients`); see `default_batch_streams`.
    batch_streams: int = 1

    @classmethod
    def from_model(cls, model: nnx.Module, *, logprob_chunk_size: int | None = None,
                   batch_streams: int = 1) -> tuple["Policy", Params]:
        if batch_streams < 1:
            raise ValueError(f"batch_streams must be >= 1, got {batch_streams}")
        graphdef, state = nnx.split(model)
        return (cls(graphdef, state, logprob_chunk_size or None, batch_streams),
                nnx.to_pure_dict(state))

    def state(self, params: Params):
        """nnx.State of the model carrying `params` (works on tracers)."""
        state = jax.tree.map(lambda x: x, self.template)
        nnx.replace_by_pure_dict(state, params)
        return state

    def bind(self, params: Params) -> nnx.Module:
        """The NNX module with `params`; call inside jit to trace through the model."""
        return nnx.merge(self.graphdef, self.state(params))


def decay_mask(params: Params) -> Params:
    """True for matrices (weight decay applies), False for norms, biases and scalars."""
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(
    *,
    lr: float,
    steps: int,
    warmup_frac: float = 0.05,
    final_lr_frac: float = 0.1,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.99,
    clip_norm: float = 1.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with linear warmup, cosine decay and global-norm clipping."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    warmup = max(1, int(round(warmup_frac * steps))) if warmup_frac > 0 else 0
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else lr,
        peak_value=lr,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=lr * final_lr_frac,
    )
    chain = []
    if clip_norm and clip_norm > 0:
        chain.append(optax.clip_by_global_norm(clip_norm))
    chain.append(
        optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=decay_mask)
    )
    return optax.chain(*chain), schedule


def split_micro_batches(batch: Any, num_micro_batches: int) -> Any:
    """Reshape every [B, ...] leaf to [num_micro_batches, B / num_micro_batches, ...]."""

    def reshape(x):
        if x.shape[0] % num_micro_batches:
            raise ValueError(
                f"batch of {x.shape[0]} rows is not divisible into {num_micro_batches} micro-batches"
            )
        return x.reshape(num_micro_batches, x.shape[0] // num_micro_batches, *x.shape[1:])

    return jax.tree.map(reshape, batch)


def default_batch_streams() -> int:
    """Row groups per update on this backend: 2 on a single-device CPU with two or more
    cores, else 1.

    XLA:CPU runs the many small element-wise ops of a small model one at a time, on one
    core, while its matmuls use all of them. Two independent row groups in one program give
    the runtime two ops it can run side by side: 0.95x the time of the GRPO update at hidden
    128 and 256 and 0.98x of the main job's pretraining step on a 2-core machine, but no
    change in the main job's wall time (benchmarks/README.md). On GPU or TPU, and when the
    rows are sharded over several devices (a slice of the batch would be resharded), it is 1.
    """
    single_cpu = jax.default_backend() == "cpu" and jax.device_count() == 1
    return 2 if single_cpu and (os.cpu_count() or 1) >= 2 else 1


def _add_parts(total: tuple, part: tuple) -> tuple:
    """(loss, grads, metrics) of two parts of a batch combined: sums, except that `*_max`
    metrics take the maximum."""
    (loss, grads, metrics), (part_loss, part_grads, part_metrics) = total, part
    return (loss + part_loss, jax.tree.map(jnp.add, grads, part_grads),
            {k: jnp.maximum(metrics[k], v) if k.endswith("_max") else metrics[k] + v
             for k, v in part_metrics.items()})


def _in_streams(grad_fn: Callable, streams: int, row_unit: int = 1) -> Callable:
    """`grad_fn(params, batch)` as the sum over `streams` contiguous row groups of the batch,
    computed independently in the same program (cut at multiples of `row_unit` rows; the
    groups differ by at most one unit)."""

    def fn(params, batch):
        rows = jax.tree.leaves(batch)[0].shape[0]
        units = rows // row_unit
        cuts = np.linspace(0, units, min(streams, units) + 1).round().astype(int) * row_unit
        parts = []
        for start, stop in zip(cuts[:-1], cuts[1:]):
            (loss, metrics), grads = grad_fn(params, jax.tree.map(lambda x: x[start:stop], batch))
            parts.append((loss, grads, metrics))
        loss, grads, metrics = functools.reduce(_add_parts, parts)
        return (loss, metrics), grads

    return fn


def accumulate_gradients(
    loss_fn: Callable[[Params, Any], tuple[jax.Array, dict]],
    params: Params,
    batch: Any,
    num_micro_batches: int,
    streams: int = 1,
    row_unit: int = 1,
) -> tuple[jax.Array, Params, dict]:
    """Sum of micro-batch losses, gradients and metrics.

    `loss_fn` must normalise with global counts (see `grpo_jax.losses.aggregate`) so that
    the sum over micro-batches equals the full-batch value exactly. Metrics whose name ends
    in `_max` are combined with a maximum instead of a sum. `metrics` must be a flat dict.

    Micro-batches run one after another (a `lax.scan`: memory for one at a time). Each is
    further split into `streams` row groups whose gradients are computed independently in
    the same program, which XLA:CPU can run side by side (`default_batch_streams`); the sum
    is the same up to float rounding. Row groups are cut at multiples of `row_unit` rows
    (which must divide a micro-batch), so units such as the completions of one prompt stay
    together.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    if (rows // max(num_micro_batches, 1)) % row_unit:
        raise ValueError(f"accumulate_gradients: row_unit {row_unit} does not divide a "
                         f"micro-batch of {rows} / {num_micro_batches} rows")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if streams > 1:
        grad_fn = _in_streams(grad_fn, streams, row_unit)
    if num_micro_batches == 1:
        (loss, metrics), grads = grad_fn(params, batch)
        return loss, grads, metrics
    micro = split_micro_batches(batch, num_micro_batches)

    def body(carry, micro_batch):
        (loss, metrics), grads = grad_fn(params, micro_batch)
        return _add_parts(carry, (loss, grads, metrics)), None

    first = jax.tree.map(lambda x: x[0], micro)
    (_, metric_shapes), _ = jax.eval_shape(grad_fn, params, first)
    zeros_metrics = {k: jnp.full(s.shape, -jnp.inf if k.endswith("_max") else 0, s.dtype)
                     for k, s in metric_shapes.items()}
    zeros_grads = jax.tree.map(jnp.zeros_like, params)
    (loss, grads, metrics), _ = jax.lax.scan(
        body, (jnp.zeros((), jnp.float32), zeros_grads, zeros_metrics), micro
    )
    return loss, grads, metrics


def all_finite(tree: Any) -> jax.Array:
    """True when every floating-point leaf of `tree` is finite (a bool scalar)."""
    checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True)


def keep_if(ok: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `ok` else `old`, leaf by leaf (ok is a bool scalar)."""
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)


def apply_if_finite(optimizer: optax.GradientTransformation, grads: Params, opt_state: Any,
                    params: Params, *, loss: jax.Array, also_ok: jax.Array | None = None):
    """One optimizer update, applied only when the loss, the gradients and the updated
    parameters are all finite (and `also_ok`); otherwise params and opt_state stay as they
    were.

    Returns:
      (params, opt_state, flags) with float flags "skipped" (1 = not applied),
      "nonfinite_loss", "nonfinite_grad" and "nonfinite_update".
    """
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    finite_loss = jnp.all(jnp.isfinite(loss))
    finite_grad = all_finite(grads)
    finite_update = all_finite(new_params)
    ok = finite_loss & finite_grad & finite_update
    if also_ok is not None:
        ok = ok & also_ok
    flags = {"skipped": (~ok).astype(jnp.float32),
             "nonfinite_loss": (~finite_loss).astype(jnp.float32),
             "nonfinite_grad": (~finite_grad).astype(jnp.float32),
             "nonfinite_update": (~finite_update).astype(jnp.float32)}
    return keep_if(ok, new_params, params), keep_if(ok, new_opt_state, opt_state), flags


def init_opt_state(optimizer: optax.GradientTransformation, params: Params, mesh=None):
    """optimizer.init(params) with every leaf on the mesh.

    Moments inherit the parameters' shardings; scalars (step counts) would otherwise sit on
    one device and come back from the first jitted step as mesh-replicated arrays, which
    changes the input shardings and compiles the step a second time.
    """
    opt_state = optimizer.init(params)
    if mesh is None:
        return opt_state
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def place(x):
        if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding):
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(place, opt_state)


def jit_update(fn: Callable, *, num_state_args: int = 2) -> Callable:
    """`jax.jit` of an update `fn(*state, batch) -> (*state, metrics)` that keeps the state's
    shardings.

    The first `num_state_args` arguments (params, optimizer state, ...) are donated and their
    outputs are pinned to the shardings the first call received. Without the pin the compiler
    may pick other output shardings (e.g. shard a norm scale over `fsdp`), and the next call,
    fed those outputs, would compile the step a second time. `.jitted()` gives the underlying
    jitted function (e.g. for `_cache_size()`), `.fn` the update function.
    """
    jitted = None

    def call(*args):
        nonlocal jitted
        if jitted is None:
            # Pin committed mesh-sharded leaves; leave the others (e.g. uncommitted arrays
            # made by jnp ops outside any mesh) to the compiler.
            state_shardings = tuple(jax.tree.map(
                lambda x: x.sharding if isinstance(getattr(x, "sharding", None),
                                                   jax.sharding.NamedSharding) else None,
                args[:num_state_args]))
            jitted = jax.jit(fn, donate_argnums=tuple(range(num_state_args)),
                             out_shardings=(*state_shardings, None))
        return jitted(*args)

    call.jitted = lambda: jitted
    call.fn = fn  # the update itself (e.g. to lower it for other shardings)
    return call
