"""Tests for grpo_jax.losses temporal credit assignment: TD, returns, k-step, GAE, token GAE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses

# One trajectory with an episode end after the last step (discount 0).
REWARDS = jnp.array([1.0, 0.0, 2.0])
VALUES = jnp.array([0.5, 1.0, -1.0, 2.0])
DISCOUNTS = jnp.array([0.9, 0.9, 0.0])


def test_td_residuals_literal():
    # 1 + .9*1 - .5, 0 + .9*(-1) - 1, 2 + 0*2 - (-1)
    np.testing.assert_allclose(
        losses.td_residuals(REWARDS, VALUES, DISCOUNTS), [1.4, -1.9, 3.0], rtol=1e-6
    )


def test_discounted_returns_literal():
    # G2 = 2 + 0 * 2, G1 = 0 + .9 * 2, G0 = 1 + .9 * 1.8
    np.testing.assert_allclose(
        losses.discounted_returns(REWARDS, DISCOUNTS, bootstrap_value=2.0),
        [2.62, 1.8, 2.0],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        losses.discounted_returns(
            jnp.array([1.0, 1.0]), jnp.array([0.5, 0.5]), bootstrap_value=4.0
        ),
        [2.5, 3.0],
    )


def test_gae_literal():
    # A2 = 3, A1 = -1.9 + .45 * 3 = -0.55, A0 = 1.4 + .45 * (-0.55) = 1.1525
    np.testing.assert_allclose(
        losses.gae(REWARDS, VALUES, DISCOUNTS, lambda_=0.5), [1.1525, -0.55, 3.0], rtol=1e-6
    )


def test_kstep_literal():
    # A^(2)_t = delta_t + gamma_t delta_{t+1}; the last step is truncated at the horizon.
    np.testing.assert_allclose(
        losses.kstep_advantages(REWARDS, VALUES, DISCOUNTS, k=2), [-0.31, 0.8, 3.0], rtol=1e-5
    )


def test_token_gae_literal():
    rewards = jnp.array([[0.0, 1.0, 5.0], [0.0, 0.0, 1.0]])
    values = jnp.array([[0.2, 0.6, 9.0], [0.5, 0.5, 0.5]])
    mask = jnp.array([[True, True, False], [True, True, True]])
    advantages, returns = losses.token_gae(rewards, values, mask, gamma=0.5, lambda_=0.5)
    # Row 0: delta1 = 1 - .6 = .4; delta0 = .5*.6 - .2 = .1; A0 = .1 + .25*.4 = .2.
    # Row 1: deltas [-.25, -.25, .5]; A1 = -.25 + .25*.5; A0 = -.25 + .25*(-.125).
    np.testing.assert_allclose(advantages, [[0.2, 0.4, 0.0], [-0.28125, -0.125, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(returns, [[0.4, 1.0, 0.0], [0.21875, 0.375, 1.0]], rtol=1e-6)


def _random_trajectory(seed, horizon=7):
    keys = jax.random.split(jax.random.key(seed), 3)
    rewards = jax.random.normal(keys[0], (horizon,))
    values = jax.random.normal(keys[1], (horizon + 1,))
    discounts = jnp.where(jax.random.uniform(keys[2], (horizon,)) < 0.2, 0.0, 0.95)
    return rewards, values, discounts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_identities(seed):
    rewards, values, discounts = _random_trajectory(seed)
    horizon = rewards.shape[0]
    td = losses.td_residuals(rewards, values, discounts)
    # lambda = 0 is the one-step TD residual; k = 1 too.
    np.testing.assert_allclose(losses.gae(rewards, values, discounts, lambda_=0.0), td, rtol=1e-6)
    np.testing.assert_allclose(
        losses.kstep_advantages(rewards, values, discounts, k=1), td, rtol=1e-6
    )
    # lambda = 1 is the Monte Carlo return (bootstrapped by V(s_T)) minus V; so is k >= T.
    mc = losses.discounted_returns(rewards, discounts, bootstrap_value=values[-1]) - values[:-1]
    np.testing.assert_allclose(
        losses.gae(rewards, values, discounts, lambda_=1.0), mc, rtol=1e-5, atol=1e-5
    )
    for k in (horizon, horizon + 3):
        np.testing.assert_allclose(
            losses.kstep_advantages(rewards, values, discounts, k=k), mc, rtol=1e-5, atol=1e-5
        )
    # GAE = (1 - lambda) sum_k lambda^{k-1} A^(k); on a finite horizon A^(k) = A^(T) for
    # k >= T, so the tail sum_{k >= T} (1 - lambda) lambda^{k-1} = lambda^{T-1} goes on A^(T).
    lam = 0.7
    weighted = sum(
        (1 - lam) * lam ** (k - 1) * losses.kstep_advantages(rewards, values, discounts, k=k)
        for k in range(1, horizon)
    )
    weighted = weighted + lam ** (horizon - 1) * losses.kstep_advantages(
        rewards, values, discounts, k=horizon
    )
    np.testing.assert_allclose(
        losses.gae(rewards, values, discounts, lambda_=lam), weighted, rtol=1e-5, atol=1e-5
    )


def test_gae_matches_direct_double_sum():
    """Independent O(T^2) implementation of A_t = sum_l prod_{j<l}(gamma lambda)_{t+j} delta."""
    rewards, values, discounts = _random_trajectory(5, horizon=6)
    lam = np.array([0.9, 0.5, 0.3, 1.0, 0.0, 0.8], np.float32)
    r, v, g = map(np.asarray, (rewards, values, discounts))
    delta = r + g * v[1:] - v[:-1]
    expected = [
        sum(np.prod((g * lam)[t : t + l]) * delta[t + l] for l in range(6 - t)) for t in range(6)
    ]
    np.testing.assert_allclose(
        losses.gae(rewards, values, discounts, lambda_=jnp.asarray(lam)),
        expected,
        rtol=1e-5,
        atol=1e-6,
    )


def test_token_gae_masked_equals_sliced():
    keys = jax.random.split(jax.random.key(3), 2)
    rewards = jax.random.normal(keys[0], (3, 6))
    values = jax.random.normal(keys[1], (3, 6))
    lengths = [6, 2, 0]
    mask = jnp.arange(6)[None, :] < jnp.array(lengths)[:, None]
    garbage = jnp.where(mask, 0.0, jnp.nan)  # padded positions must not leak
    advantages, returns = losses.token_gae(
        rewards + garbage, values + garbage, mask, gamma=0.9, lambda_=0.8
    )
    assert np.all(np.isfinite(advantages)) and np.all(np.isfinite(returns))
    for row, n in enumerate(lengths):
        expected = (
            losses.gae(
                rewards[row, :n], jnp.append(values[row, :n], 0.0), jnp.full((n,), 0.9), lambda_=0.8
            )
            if n
            else jnp.zeros(0)
        )
        np.testing.assert_allclose(advantages[row, :n], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            returns[row, :n], expected + values[row, :n], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_array_equal(advantages[row, n:], 0.0)
        np.testing.assert_array_equal(returns[row, n:], 0.0)


def test_bad_shapes_give_value_errors():
    with pytest.raises(ValueError, match="`values` must have shape \\(4,\\)"):
        losses.gae(REWARDS, VALUES[:3], DISCOUNTS, lambda_=0.5)
    with pytest.raises(ValueError, match="`k` must be"):
        losses.kstep_advantages(REWARDS, VALUES, DISCOUNTS, k=0)
    with pytest.raises(ValueError, match="rewards, values must have the same shape"):
        losses.token_gae(
            jnp.ones((2, 3)), jnp.ones((2, 4)), jnp.ones((2, 3), bool), gamma=1.0, lambda_=1.0
        )
