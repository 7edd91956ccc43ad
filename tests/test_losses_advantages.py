"""Tests for grpo_jax.losses: policy_gradient, group/RLOO advantages, baselines, whitening."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_jax import losses


def test_policy_gradient_literal():
    loss = losses.policy_gradient(jnp.array([-1.0, -2.0]), jnp.array([2.0, -0.5]))
    np.testing.assert_allclose(loss, [2.0, -1.0])


def test_policy_gradient_treats_advantages_as_constants_and_upcasts():
    logp = jnp.array([-1.0, -2.0], jnp.bfloat16)
    advantages = jnp.array([2.0, -0.5], jnp.bfloat16)
    assert losses.policy_gradient(logp, advantages).dtype == jnp.float32
    grad_a = jax.grad(lambda a: losses.policy_gradient(jnp.array([-1.0, -2.0]), a).sum())(
        jnp.array([2.0, -0.5])
    )
    np.testing.assert_array_equal(grad_a, [0.0, 0.0])
    grad_logp = jax.grad(lambda lp: losses.policy_gradient(lp, jnp.array([2.0, -0.5])).sum())(
        jnp.array([-1.0, -2.0])
    )
    np.testing.assert_allclose(grad_logp, [-2.0, 0.5])


REWARDS = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_group_advantages_group_scale_literal():
    # Group 1: mean 0.5, unbiased std sqrt(1/3); +-0.5 / sqrt(1/3) = +-sqrt(3)/2. Group 2: equal.
    adv = losses.group_advantages(REWARDS, group_size=4, scale="group", eps=0.0)
    h = 0.8660254
    np.testing.assert_allclose(adv, [h, -h, -h, h, 0, 0, 0, 0], rtol=1e-6)
    adv_eps = losses.group_advantages(REWARDS, group_size=4, scale="group", eps=1e-6)
    np.testing.assert_allclose(adv_eps[0], 0.5 / (0.57735027 + 1e-6), rtol=1e-6)


def test_group_advantages_batch_and_none_literal():
    # Batch std (ddof=1) of REWARDS: sqrt(1.5 / 7); 0.5 / sqrt(3/14) = 1.0801234.
    adv = losses.group_advantages(REWARDS, group_size=4, scale="batch", eps=0.0)
    b = 1.0801234
    np.testing.assert_allclose(adv, [b, -b, -b, b, 0, 0, 0, 0], rtol=1e-6)
    adv = losses.group_advantages(REWARDS, group_size=4, scale="none")
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_equal_rewards_give_exact_zero_not_nan(scale, eps):
    # 0.1 * 3 / 3 != 0.1 in float32 rounding; the result must still be exactly 0.
    rewards = jnp.array([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    adv = losses.group_advantages(rewards, group_size=3, scale=scale, eps=eps)
    np.testing.assert_array_equal(adv, np.zeros(6))
    grad = jax.grad(lambda r: losses.group_advantages(r, group_size=3, scale=scale, eps=eps)[0])(
        rewards
    )
    assert np.all(np.isfinite(grad))


def test_rloo_literal_and_equivalence():
    adv = losses.rloo_advantages(REWARDS, group_size=4)
    t = 2.0 / 3.0  # 1 - 1/3 and 0 - 2/3
    np.testing.assert_allclose(adv, [t, -t, -t, t, 0, 0, 0, 0], rtol=1e-6)
    rewards = jax.random.normal(jax.random.key(0), (12,))
    grouped = np.asarray(rewards).reshape(3, 4)
    others = (grouped.sum(-1, keepdims=True) - grouped) / 3
    np.testing.assert_allclose(
        losses.rloo_advantages(rewards, group_size=4).reshape(3, 4),
        grouped - others,
        rtol=1e-5,
        atol=1e-6,
    )


def test_optimal_baseline_literal_and_minimises_variance():
    np.testing.assert_allclose(
        losses.optimal_baseline(jnp.array([1.0, 0.0, 2.0]), jnp.array([1.0, 2.0, 1.0])), 0.75
    )
    np.testing.assert_allclose(
        losses.optimal_baseline(jnp.array([1.0, 0.0, 2.0]), jnp.zeros(3)), 1.0
    )
    # Exact expectation over a 4-action softmax policy: Var(b) = sum_a pi ||g_a||^2 (R_a - b)^2
    # (the mean term does not depend on b), minimised by the baseline from pi-weighted norms.
    logits = jnp.array([0.3, -1.0, 0.5, 1.2])
    rewards = jnp.array([1.0, 0.0, 3.0, -2.0])
    probs = jax.nn.softmax(logits)
    scores = jax.jacobian(jax.nn.log_softmax)(logits)  # [A, A]: grad of log pi(a)
    sq_norms = jnp.sum(scores**2, axis=-1)
    b_star = losses.optimal_baseline(rewards, probs * sq_norms)  # weights pi(a)||g_a||^2

    def second_moment(b):
        return jnp.sum(probs * sq_norms * (rewards - b) ** 2)

    np.testing.assert_allclose(jax.grad(second_moment)(b_star), 0.0, atol=1e-5)
    assert second_moment(b_star) < second_moment(jnp.sum(probs * rewards))


def test_state_dependent_baseline_leaves_expected_gradient_unchanged():
    """sum_a pi(a|s) grad log pi(a|s) b(s) = b(s) grad sum_a pi(a|s) = 0, exactly."""
    keys = jax.random.split(jax.random.key(1), 3)
    theta = jax.random.normal(keys[0], (3, 4))
    rewards = jax.random.normal(keys[1], (3, 4))
    state_probs = jnp.array([0.2, 0.5, 0.3])

    def expected_loss(theta, baseline):
        logp = jax.nn.log_softmax(theta, axis=-1)
        weights = state_probs[:, None] * jax.lax.stop_gradient(jnp.exp(logp))
        return jnp.sum(weights * losses.policy_gradient(logp, rewards - baseline[:, None]))

    def true_objective(theta):
        return jnp.sum(state_probs[:, None] * jax.nn.softmax(theta, axis=-1) * rewards)

    grad_true = jax.grad(true_objective)(theta)
    for baseline in [
        jnp.zeros(3),
        jax.random.normal(keys[2], (3,)) * 5.0,
        jnp.sum(jax.nn.softmax(theta) * rewards, axis=-1),
    ]:
        grad = jax.grad(expected_loss)(theta, baseline)
        np.testing.assert_allclose(grad, -grad_true, atol=1e-5)


def test_whiten_literal():
    x = jnp.array([1.0, 2.0, 3.0, 100.0])
    mask = jnp.array([True, True, True, False])
    s = 1.2247449  # 1 / sqrt(2/3)
    np.testing.assert_allclose(losses.whiten(x, mask), [-s, 0.0, s, 0.0], rtol=1e-6)
    np.testing.assert_allclose(
        losses.whiten(x, mask, shift_mean=False), [2.0 - s, 2.0, 2.0 + s, 0.0], rtol=1e-6
    )
    y = losses.whiten(jnp.array([[1.0, 3.0], [5.0, 7.0]]))
    np.testing.assert_allclose(y, np.array([[-3.0, -1.0], [1.0, 3.0]]) / np.sqrt(5.0), rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-10, 10, width=32), min_size=6, max_size=6),
    st.sampled_from(["group", "batch", "none"]),
)
def test_group_advantages_properties(rewards, scale):
    """Finite, zero mean within each group, unit unbiased std for "group" when spread."""
    rewards = jnp.array(rewards, jnp.float32)
    adv = np.asarray(losses.group_advantages(rewards, group_size=3, scale=scale, eps=0.0))
    assert np.all(np.isfinite(adv))
    grouped = adv.reshape(2, 3)
    np.testing.assert_allclose(grouped.mean(-1), 0.0, atol=1e-4 * (1 + np.abs(grouped).max()))
    raw = np.asarray(rewards).reshape(2, 3)
    for row, r in zip(grouped, raw):
        if scale == "group" and r.std() > 1e-2:
            np.testing.assert_allclose(row.std(ddof=1), 1.0, rtol=1e-3)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: losses.group_advantages(jnp.ones(7), group_size=4), "not a multiple"),
        (lambda: losses.group_advantages(jnp.ones(8), group_size=4, scale="std"), "`scale`"),
        (
            lambda: losses.group_advantages(jnp.ones((2, 4)), group_size=4),
            "`rewards` must have rank 1",
        ),
        (lambda: losses.rloo_advantages(jnp.ones(4), group_size=1), ">= 2"),
        (lambda: losses.policy_gradient(jnp.ones(3), jnp.ones(4)), "logp(3,), advantages(4,)"),
        (lambda: losses.whiten(jnp.ones(3), jnp.ones(4, bool)), "mask"),
    ],
)
def test_bad_input_gives_value_error(call, message):
    with pytest.raises(ValueError, match=None) as info:
        call()
    assert message in str(info.value)
