"""Tests for grpo_jax.losses.aggregate: literal values, micro-batching, masking."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_jax import losses

MODES = losses.AGGREGATION_MODES
PER_TOKEN = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = jnp.array([[True, True, False], [True, False, False]])


def test_aggregate_literal():
    expected = {
        "token-mean": 7.0 / 3.0,  # (1 + 2 + 4) / 3
        "seq-mean-token-mean": 2.75,  # (3/2 + 4/1) / 2
        "seq-mean-token-sum": 3.5,  # (3 + 4) / 2
        "seq-mean-token-sum-norm": 7.0 / 6.0,  # 7 / (T=3 * 2)
    }
    for mode, value in expected.items():
        np.testing.assert_allclose(losses.aggregate(PER_TOKEN, MASK, mode=mode), value, rtol=1e-6)
    # Global counts override the local ones.
    np.testing.assert_allclose(
        losses.aggregate(PER_TOKEN, MASK, mode="token-mean", num_tokens=7), 1.0
    )
    np.testing.assert_allclose(
        losses.aggregate(PER_TOKEN, MASK, mode="seq-mean-token-mean", num_sequences=4), 1.375
    )
    np.testing.assert_allclose(
        losses.aggregate(PER_TOKEN, MASK, mode="seq-mean-token-sum-norm", max_len=4), 0.875
    )


def _batch(seed, batch=8, length=5):
    keys = jax.random.split(jax.random.key(seed), 3)
    features = jax.random.normal(keys[0], (batch, length))
    lengths = jax.random.randint(keys[1], (batch,), 0, length + 1).at[0].set(0)  # an empty row
    mask = jnp.arange(length)[None, :] < lengths[:, None]
    theta = jax.random.normal(keys[2], (length,))
    return features, mask, theta


def _loss(theta, features, mask, mode, **counts):
    per_token = jnp.sin(features * theta[None, :]) + features**2
    return losses.aggregate(per_token, mask, mode=mode, **counts)


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_sum_to_full_batch(mode):
    """Four micro-batches with global counts give the full batch's value and gradient."""
    features, mask, theta = _batch(0)
    counts = {
        "num_tokens": jnp.sum(mask),
        "num_sequences": jnp.sum(jnp.any(mask, -1)),
        "max_len": features.shape[1],
    }
    full_value, full_grad = jax.value_and_grad(_loss)(theta, features, mask, mode)
    micro = jax.jit(jax.value_and_grad(_loss), static_argnames="mode")
    value, grad = 0.0, jnp.zeros_like(theta)
    for part in range(4):
        rows = slice(2 * part, 2 * part + 2)
        v, g = micro(theta, features[rows], mask[rows], mode=mode, **counts)
        value, grad = value + v, grad + g
    np.testing.assert_allclose(value, full_value, rtol=1e-5)
    np.testing.assert_allclose(grad, full_grad, rtol=1e-5, atol=1e-6)
    # And the defaults of the full batch are those global counts.
    np.testing.assert_allclose(_loss(theta, features, mask, mode, **counts), full_value, rtol=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(MODES))
def test_micro_batch_property(seed, mode):
    features, mask, theta = _batch(seed, batch=4, length=3)
    counts = {
        "num_tokens": jnp.sum(mask),
        "num_sequences": jnp.sum(jnp.any(mask, -1)),
        "max_len": 3,
    }
    full = jax.grad(_loss)(theta, features, mask, mode)
    parts = sum(
        jax.grad(_loss)(theta, features[i : i + 1], mask[i : i + 1], mode, **counts)
        for i in range(4)
    )
    np.testing.assert_allclose(parts, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_masked_equals_sliced(mode):
    """Padding columns and empty rows (holding garbage) change neither the value nor gradient.

    (Garbage is finite here: NaN upstream of `aggregate` would reach the parameter gradient
    through the chain rule, 0 * NaN; NaN in `per_token` itself is covered below.)
    """
    features, mask, theta = _batch(1, batch=4, length=4)
    mask = mask.at[0].set(True)  # at least one full row
    padded_features = jnp.concatenate(
        [jnp.pad(features, ((0, 0), (0, 3)), constant_values=1e3), jnp.full((2, 7), -1e3)]
    )
    padded_mask = jnp.pad(mask, ((0, 2), (0, 3)))
    padded_theta = jnp.concatenate([theta, jnp.ones(3)])
    counts = {"max_len": 4} if mode == "seq-mean-token-sum-norm" else {}
    value, grad = jax.value_and_grad(_loss)(theta, features, mask, mode, **counts)
    padded_value, padded_grad = jax.value_and_grad(_loss)(
        padded_theta, padded_features, padded_mask, mode, **counts
    )
    np.testing.assert_allclose(padded_value, value, rtol=1e-6)
    np.testing.assert_allclose(padded_grad[:4], grad, rtol=1e-6)
    np.testing.assert_array_equal(padded_grad[4:], 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_masked_equals_ragged_reference(mode):
    """Independent per-sequence computation on the sliced (ragged) rows."""
    features, mask, _ = _batch(2, batch=6, length=5)
    lengths = np.asarray(mask.sum(-1))
    rows = [np.asarray(features[i, :n]) for i, n in enumerate(lengths)]
    nonempty = [r for r in rows if len(r)]
    if mode == "token-mean":
        expected = np.concatenate(rows).sum() / lengths.sum()
    elif mode == "seq-mean-token-mean":
        expected = np.mean([r.mean() for r in nonempty])
    elif mode == "seq-mean-token-sum":
        expected = np.mean([r.sum() for r in nonempty])
    else:
        expected = np.mean([r.sum() / 5 for r in nonempty])
    np.testing.assert_allclose(losses.aggregate(features, mask, mode=mode), expected, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_rows_give_finite_zeros(mode):
    per_token = jnp.array([[jnp.nan, jnp.inf, 1.0], [2.0, 3.0, -jnp.inf]])
    empty = jnp.zeros((2, 3), bool)
    value, grad = jax.value_and_grad(lambda x: losses.aggregate(x, empty, mode=mode))(per_token)
    assert value == 0.0
    np.testing.assert_array_equal(grad, np.zeros((2, 3)))
    one_row = jnp.array([[False, False, False], [True, True, False]])
    value, grad = jax.value_and_grad(lambda x: losses.aggregate(x, one_row, mode=mode))(per_token)
    assert np.isfinite(value)
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[0], 0.0)
    np.testing.assert_array_equal(grad[1, 2], 0.0)


def test_aggregate_bad_input():
    with pytest.raises(ValueError, match="`mode` must be one of"):
        losses.aggregate(PER_TOKEN, MASK, mode="mean")
    with pytest.raises(ValueError, match="per_token, mask must have the same shape"):
        losses.aggregate(PER_TOKEN, MASK[:, :2], mode="token-mean")
    with pytest.raises(ValueError, match="`per_token` must have rank 2"):
        losses.aggregate(PER_TOKEN[0], MASK[0], mode="token-mean")
