"""Entry checks shared by the loss kernels: chex assertions re-raised as one-line ValueErrors."""

from __future__ import annotations

import chex
import jax.numpy as jnp


def as_float(x) -> jnp.ndarray:
    """Returns `x` as a floating array of at least float32 precision (bf16/f16/int -> f32)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits >= 32:
        return x
    return x.astype(jnp.float32)


def _describe(names, arrays) -> str:
    return ", ".join(f"{n}{tuple(jnp.shape(a))}" for n, a in zip(names, arrays))


def check_rank(fn: str, rank, **arrays) -> None:
    """Raises ValueError naming the field when an array does not have the expected rank."""
    for name, x in arrays.items():
        try:
            chex.assert_rank(x, rank)
        except AssertionError:
            raise ValueError(
                f"{fn}: `{name}` must have rank {rank}, got shape {tuple(jnp.shape(x))}"
            ) from None


def check_same_shape(fn: str, **arrays) -> None:
    """Raises ValueError naming the fields when the arrays' shapes differ."""
    names, values = list(arrays), list(arrays.values())
    try:
        chex.assert_equal_shape(values)
    except AssertionError:
        raise ValueError(
            f"{fn}: {', '.join(names)} must have the same shape, got {_describe(names, values)}"
        ) from None


def check_shape(fn: str, name: str, x, shape) -> None:
    """Raises ValueError naming the field when `x` does not have shape `shape`."""
    try:
        chex.assert_shape(x, shape)
    except AssertionError:
        raise ValueError(
            f"{fn}: `{name}` must have shape {tuple(shape)}, got {tuple(jnp.shape(x))}"
        ) from None


def check_choice(fn: str, name: str, value, choices) -> None:
    """Raises ValueError when a string option is not one of `choices`."""
    if value not in choices:
        raise ValueError(f"{fn}: `{name}` must be one of {list(choices)}, got {value!r}")


def check_mask(fn: str, mask, like, like_name: str):
    """Returns `mask` as bool after checking it has the shape of `like`."""
    mask = jnp.asarray(mask)
    check_same_shape(fn, **{like_name: like, "mask": mask})
    return mask.astype(bool)
