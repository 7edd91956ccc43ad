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

from grpo_jax.models import lora as lora_lib

Params = Any  # nested dict of arrays, or a LoRA tree of them (`grpo_jax.models.lora`)

# merge(base, adapters) as one program (the sampler binds a LoRA policy outside any jit).
_merge = jax.jit(lora_lib.merge, static_argnames=("alpha", "rank"))


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
    # Rows per tile of the output head (None: all rows): with logprob_chunk_size, the
    # logits exist [rows, chunk, V] at a time (`models.logprobs`).
    logprob_chunk_rows: int | None = None
    # LoRA settings when the parameters are a LoRA tree {"base", "lora"}: the model then
    # runs on `lora.merge(base, adapters)`; a plain tree binds as it is (e.g. the base).
    lora: lora_lib.LoraConfig | None = None

    @classmethod
    def from_model(cls, model: nnx.Module, *, logprob_chunk_size: int | None = None,
                   batch_streams: int = 1, logprob_chunk_rows: int | None = None,
                   ) -> tuple["Policy", Params]:
        if batch_streams < 1:
            raise ValueError(f"batch_streams must be >= 1, got {batch_streams}")
        graphdef, state = nnx.split(model)
        return (cls(graphdef, state, logprob_chunk_size or None, batch_streams,
                    logprob_chunk_rows or None), nnx.to_pure_dict(state))

    def state(self, params: Params):
        """nnx.State of the model carrying `params` (works on tracers); a LoRA tree is
        merged first (W + (alpha / r) A B)."""
        if self.lora is not None and lora_lib.is_lora(params):
            params = _merge(params[lora_lib.BASE], params[lora_lib.ADAPTERS],
                            alpha=self.lora.alpha, rank=self.lora.rank)
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
    """AdamW with linear warmup, cosine decay and global-norm clipping.

    The warmup of W steps rises linearly from lr / (W + 1) at step 0 to lr at step W (step
    k: lr (k + 1) / (W + 1)), so that no step is taken at learning rate 0 (a two-step smoke
    run would otherwise train once); then cosine decay to lr * final_lr_frac at `steps`."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    warmup = max(1, int(round(warmup_frac * steps))) if warmup_frac > 0 else 0
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=lr / (warmup + 1) if warmup else lr,
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


def split_micro_batches(batch: Any, num_micro_batches: int, row_unit: int = 1) -> Any:
    """Every [B, ...] leaf as [M, B / M, ...] (M = num_micro_batches), the batch's units of
    `row_unit` rows dealt round-robin: micro-batch m holds units m, m + M, m + 2M, ...

    Dealt, not cut into M contiguous blocks: when the rows are split over devices in
    contiguous blocks, every micro-batch then has its share of rows on every device (a
    contiguous cut would put micro-batch m on 1/M of the devices and make XLA gather the
    batch). A unit (the completions of one prompt) stays whole and in order.
    """
    m, unit = num_micro_batches, row_unit

    def reshape(x):
        if x.shape[0] % (m * unit):
            raise ValueError(f"batch of {x.shape[0]} rows is not divisible into {m} "
                             f"micro-batches of whole {unit}-row units")
        dealt = x.reshape(x.shape[0] // (m * unit), m, unit, *x.shape[1:]).swapaxes(0, 1)
        return dealt.reshape(m, x.shape[0] // m, *x.shape[1:])

    return jax.tree.map(reshape, batch)


def merge_micro_batches(micro: Any, row_unit: int = 1) -> Any:
    """The inverse of `split_micro_batches`: [M, B / M, ...] leaves back to [B, ...]."""

    def merge(x):
        m, rows = x.shape[:2]
        undealt = x.reshape(m, rows // row_unit, row_unit, *x.shape[2:]).swapaxes(0, 1)
        return undealt.reshape(m * rows, *x.shape[2:])

    return jax.tree.map(merge, micro)


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

    Micro-batches (`split_micro_batches`: units of `row_unit` rows dealt round-robin) run
    one after another (a `lax.scan`: memory for one at a time). Each is
    further split into `streams` row groups whose gradients are computed independently in
    the same program, which XLA:CPU can run side by side (`default_batch_streams`); the sum
    is the same up to float rounding. Row groups are cut at multiples of `row_unit` rows
    (which must divide a micro-batch), so units such as the completions of one prompt stay
    together.

    Gradients are taken with respect to `lora.trainable(params)` only: for a LoRA tree the
    adapters (`grads` is adapter-shaped; the frozen base gets none), else all of `params`.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    if (rows // max(num_micro_batches, 1)) % row_unit:
        raise ValueError(f"accumulate_gradients: row_unit {row_unit} does not divide a "
                         f"micro-batch of {rows} / {num_micro_batches} rows")
    part = lora_lib.trainable(params)
    grad_fn = jax.value_and_grad(
        lambda p, b: loss_fn(lora_lib.with_trainable(params, p), b), has_aux=True)
    if streams > 1:
        grad_fn = _in_streams(grad_fn, streams, row_unit)
    if num_micro_batches == 1:
        (loss, metrics), grads = grad_fn(part, batch)
        return loss, grads, metrics
    micro = split_micro_batches(batch, num_micro_batches, row_unit)

    def body(carry, micro_batch):
        (loss, metrics), grads = grad_fn(part, micro_batch)
        return _add_parts(carry, (loss, grads, metrics)), None

    first = jax.tree.map(lambda x: x[0], micro)
    (_, metric_shapes), _ = jax.eval_shape(grad_fn, part, first)
    zeros_metrics = {k: jnp.full(s.shape, -jnp.inf if k.endswith("_max") else 0, s.dtype)
                     for k, s in metric_shapes.items()}
    zeros_grads = jax.tree.map(jnp.zeros_like, part)
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


# The flags of `apply_if_finite` (float, 1 = true), in every update step's metrics.
FINITE_FLAGS = ("skipped", "nonfinite_loss", "nonfinite_grad", "nonfinite_update")


def apply_if_finite(optimizer: optax.GradientTransformation, grads: Params, opt_state: Any,
                    params: Params, *, loss: jax.Array, also_ok: jax.Array | None = None):
    """One optimizer update, applied only when the loss, the gradients and the updated
    parameters are all finite (and `also_ok`); otherwise params and opt_state stay as they
    were. `grads` and `opt_state` cover `lora.trainable(params)` (a LoRA tree's adapters;
    its base is returned as it is).

    Returns:
      (params, opt_state, flags) with float flags "skipped" (1 = not applied),
      "nonfinite_loss", "nonfinite_grad" and "nonfinite_update".
    """
    part = lora_lib.trainable(params)
    updates, new_opt_state = optimizer.update(grads, opt_state, part)
    new_part = optax.apply_updates(part, updates)
    finite_loss = jnp.all(jnp.isfinite(loss))
    finite_grad = all_finite(grads)
    finite_update = all_finite(new_part)
    ok = finite_loss & finite_grad & finite_update
    if also_ok is not None:
        ok = ok & also_ok
    flags = {"skipped": (~ok).astype(jnp.float32),
             "nonfinite_loss": (~finite_loss).astype(jnp.float32),
             "nonfinite_grad": (~finite_grad).astype(jnp.float32),
             "nonfinite_update": (~finite_update).astype(jnp.float32)}
    return (lora_lib.with_trainable(params, keep_if(ok, new_part, part)),
            keep_if(ok, new_opt_state, opt_state), flags)


def optimizer_step(loss_fn: Callable[[Params, Any], tuple[jax.Array, dict]],
                   optimizer: optax.GradientTransformation, params: Params, opt_state: Any,
                   batch: Any, *, micro_batches: int, streams: int = 1, row_unit: int = 1,
                   grad_norm_name: str = "grad_norm"):
    """The tail of every update step: `accumulate_gradients` of `loss_fn` over the batch's
    micro-batches, the gradients' global norm, then `apply_if_finite`.

    Returns:
      (params, opt_state, metrics): loss_fn's metrics summed over the micro-batches, the
      global norm of the gradients as `grad_norm_name`, and apply_if_finite's flags
      (FINITE_FLAGS: "skipped" = 1 when the update was not applied).
    """
    loss, grads, metrics = accumulate_gradients(loss_fn, params, batch, micro_batches, streams,
                                                row_unit=row_unit)
    metrics[grad_norm_name] = optax.global_norm(grads)
    params, opt_state, flags = apply_if_finite(optimizer, grads, opt_state, params, loss=loss)
    return params, opt_state, {**metrics, **flags}


def init_opt_state(optimizer: optax.GradientTransformation, params: Params, mesh=None):
    """optimizer.init(lora.trainable(params)) with every leaf on the mesh: the state of a
    LoRA tree's adapters only.

    Moments inherit the parameters' shardings; scalars (step counts) would otherwise sit on
    one device and come back from the first jitted step as mesh-replicated arrays, which
    changes the input shardings and compiles the step a second time.
    """
    opt_state = optimizer.init(lora_lib.trainable(params))
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
    fed those outputs, would compile the step a second time. The frozen base of a LoRA tree
    in the state (`lora.detach_bases`) is passed as an argument that is neither donated nor
    returned: the caller's base arrays (shared with a reference, say) stay valid and are never
    copied. `.jitted()` gives the underlying jitted function (e.g. for `_cache_size()`), `.fn`
    the update function.
    """
    jitted = None

    def with_bases(bases, *args):  # fn with the LoRA bases kept out of the donated state
        state = lora_lib.attach_bases(tuple(args[:num_state_args]), bases)
        out = fn(*state, *args[num_state_args:])
        new_state, _ = lora_lib.detach_bases(tuple(out[:num_state_args]))
        return (*new_state, *out[num_state_args:])

    def call(*args):
        nonlocal jitted
        state, bases = lora_lib.detach_bases(tuple(args[:num_state_args]))
        if jitted is None:
            # Pin committed mesh-sharded leaves; leave the others (e.g. uncommitted arrays
            # made by jnp ops outside any mesh) to the compiler.
            state_shardings = tuple(jax.tree.map(
                lambda x: x.sharding if isinstance(getattr(x, "sharding", None),
                                                   jax.sharding.NamedSharding) else None,
                state))
            if bases:
                jitted = jax.jit(with_bases, out_shardings=(*state_shardings, None),
                                 donate_argnums=tuple(range(1, num_state_args + 1)))
            else:
                jitted = jax.jit(fn, donate_argnums=tuple(range(num_state_args)),
                                 out_shardings=(*state_shardings, None))
        if not bases:
            return jitted(*args)
        out = jitted(bases, *state, *args[num_state_args:])
        new_state = lora_lib.attach_bases(tuple(out[:num_state_args]), bases)
        return (*new_state, *out[num_state_args:])

    call.jitted = lambda: jitted
    call.fn = fn  # the update itself (e.g. to lower it for other shardings)
    return call
