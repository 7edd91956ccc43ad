"""LoRA: low-rank adapters on the kernels of a plain parameter tree.

A LoRA policy's parameters are one tree `{"base": params, "lora": adapters}`: the frozen
base (the model's own nested dict of arrays, kept in the compute dtype) and, for each
targeted kernel W, a pair {"a": A [..., in, r], "b": B [..., r, out]} at W's path in
`adapters`. The model runs on `merge(base, adapters)`, W + (alpha / r) A B; an optimizer
sees only the adapters (`trainable` / `with_trainable`). Everything here is a pure function
of pytrees: no module, no config.

Attention kernels are 3-D ([D, N, H] for q / k / v, [N, H, D] for o): their non-D axes are
flattened into the adapter's in / out width (`TARGETS`). Leading axes before those (a
stacked-layer axis [L, ...]) are batch axes of A and B.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

Params = Any  # nested dict of arrays

BASE, ADAPTERS = "base", "lora"
# Kernel name -> (trailing input axes, trailing output axes) of the weight.
TARGETS = {
    "q_kernel": (1, 2),  # [D, N, H]
    "k_kernel": (1, 2),  # [D, K, H]
    "v_kernel": (1, 2),  # [D, K, H]
    "o_kernel": (2, 1),  # [N, H, D]
    "gate_kernel": (1, 1),  # [D, F]
    "up_kernel": (1, 1),  # [D, F]
    "down_kernel": (1, 1),  # [F, D]
}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Static LoRA settings (hashable).

    Attributes:
      rank: r, the adapters' inner width.
      alpha: the scale numerator; the update is (alpha / r) A B.
      targets: kernel names (keys of `TARGETS`) that get adapters.
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def is_lora(tree: Any) -> bool:
    """True for a LoRA parameter tree {"base": ..., "lora": ...}."""
    return isinstance(tree, Mapping) and set(tree.keys()) == {BASE, ADAPTERS}


def combine(base: Params, adapters: Params) -> Params:
    """The LoRA parameter tree of a frozen base and its adapters."""
    return {BASE: base, ADAPTERS: adapters}


def _is_pair(node: Any) -> bool:
    return isinstance(node, Mapping) and set(node.keys()) == {"a", "b"}


def _dims(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int]:
    """(leading shape, flattened in width, flattened out width) of kernel `name`."""
    n_in, n_out = TARGETS[name]
    if len(shape) < n_in + n_out:
        raise ValueError(f"lora: kernel {name!r} of shape {shape} has fewer than "
                         f"{n_in + n_out} axes")
    lead = len(shape) - n_in - n_out
    return (tuple(shape[:lead]), math.prod(shape[lead:lead + n_in]),
            math.prod(shape[lead + n_in:]))


def _nest(pairs: list[tuple[tuple, Any]]) -> dict:
    out: dict = {}
    for path, value in pairs:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def _targeted(params: Params, targets) -> list[tuple[tuple, jax.Array]]:
    """(key path, leaf) of every leaf whose name is in `targets`, in flattening order."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path)
        if keys and keys[-1] in targets:
            found.append((keys, leaf))
    return found


def _check(rank: int, targets) -> tuple[str, ...]:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora: rank must be an int >= 1, got {rank!r}")
    targets = tuple(targets)
    unknown = [t for t in targets if t not in TARGETS]
    if not targets or unknown:
        raise ValueError(f"lora: targets must be names in {sorted(TARGETS)}, got "
                         f"{list(targets)}")
    return targets


def init_adapters(params: Params, key: jax.Array, *, rank: int, targets) -> Params:
    """Adapters for the `targets` kernels of `params`: A random, B zero (float32).

    A ~ N(0, 1 / in) (fan-in scaled, as a default linear layer's kernel), B = 0, so that
    merge(params, adapters) == params and the first update moves B only (Hu et al. 2021,
    https://arxiv.org/abs/2106.09685, section 4.1).

    Args:
      params: the base parameter tree (nested dicts of arrays, or of ShapeDtypeStructs).
      key: a PRNG key; each targeted kernel gets its own fold.
      rank: r >= 1.
      targets: kernel names (keys of `TARGETS`); each must name at least one leaf.

    Returns:
      a tree with, at the path of each targeted kernel W [*lead, *in, *out], the pair
      {"a": [*lead, prod(in), r], "b": [*lead, r, prod(out)]} in float32.
    """
    targets = _check(rank, targets)
    found = _targeted(params, targets)
    missing = sorted(set(targets) - {path[-1] for path, _ in found})
    if missing:
        raise ValueError(f"lora: targets {missing} name no parameter of the model")
    pairs = []
    for i, (path, leaf) in enumerate(found):
        lead, n_in, n_out = _dims(path[-1], tuple(leaf.shape))
        a = jax.random.normal(jax.random.fold_in(key, i), (*lead, n_in, rank), jnp.float32)
        pairs.append((path, {"a": a / math.sqrt(n_in),
                             "b": jnp.zeros((*lead, rank, n_out), jnp.float32)}))
    return _nest(pairs)


def merge_kernel(w: jax.Array, a: jax.Array, b: jax.Array, *, scale: float) -> jax.Array:
    """W + scale * A B, reshaped to W's shape, in W's dtype (the sum in float32).

    Args:
      w: [*lead, *in, *out] kernel.
      a: [*lead, prod(in), r].
      b: [*lead, r, prod(out)].
      scale: alpha / r.

    Returns:
      [*lead, *in, *out] in w.dtype.
    """
    delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    return (w.astype(jnp.float32) + scale * delta.reshape(w.shape)).astype(w.dtype)


def merge(base: Params, adapters: Params, *, alpha: float, rank: int) -> Params:
    """The parameters the model runs on: W_eff = W + (alpha / rank) A B at every adapter.

    W_eff = W + (alpha / r) A B (Hu et al. 2021, https://arxiv.org/abs/2106.09685, eq. 3),
    with A B reshaped to W's shape. Pure and jit-able; any leading (stacked-layer) axes of
    W are batch axes of A and B. Leaves without an adapter are passed through as they are.

    Args:
      base: the base parameter tree.
      adapters: `init_adapters`' tree (or one trained from it).
      alpha: the scale numerator.
      rank: r.

    Returns:
      a tree like `base` (each merged kernel in its base dtype).
    """
    scale = alpha / rank

    def walk(node, ad):
        if _is_pair(ad):
            return merge_kernel(node, ad["a"], ad["b"], scale=scale)
        out = dict(node)
        for k, sub in ad.items():
            out[k] = walk(node[k], sub)
        return out

    return walk(base, adapters)


def trainable(params: Params) -> Params:
    """The part of `params` an optimizer updates: a LoRA tree's adapters, else all of it."""
    return params[ADAPTERS] if is_lora(params) else params


def with_trainable(params: Params, part: Params) -> Params:
    """`params` with its trainable part (`trainable`) replaced by `part`."""
    return combine(params[BASE], part) if is_lora(params) else part


def copy_trainable(params: Params) -> Params:
    """A copy to hold fixed (e.g. an RL reference): the trainable part is copied, a LoRA
    tree's frozen base is shared (no second copy of the model)."""
    part = jax.tree.map(jnp.copy, trainable(params))
    return with_trainable(params, part)


def _is_detached(node: Any) -> bool:
    return isinstance(node, Mapping) and set(node.keys()) == {ADAPTERS}


def detach_bases(tree: Any) -> tuple[Any, list]:
    """Every LoRA tree inside `tree` without its base: (tree with each {"base", "lora"}
    replaced by {"lora"}, the bases in flattening order). `attach_bases` inverts it."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_lora)
    bases = [leaf[BASE] for leaf in leaves if is_lora(leaf)]
    leaves = [{ADAPTERS: leaf[ADAPTERS]} if is_lora(leaf) else leaf for leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, leaves), bases


def attach_bases(tree: Any, bases: list) -> Any:
    """The inverse of `detach_bases`: each {"lora"} of `tree` gets the next of `bases`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_detached)
    detached = [i for i, leaf in enumerate(leaves) if _is_detached(leaf)]
    if len(detached) != len(bases):
        raise ValueError(f"lora: {len(detached)} detached adapter trees for {len(bases)} "
                         "bases")
    for i, base in zip(detached, bases):
        leaves[i] = combine(base, leaves[i][ADAPTERS])
    return jax.tree_util.tree_unflatten(treedef, leaves)


def num_adapter_params(adapters: Params) -> int:
    """Number of scalars in the adapters."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(adapters))
