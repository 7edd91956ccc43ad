"""Tests for grpo_jax.losses: clipped surrogate (PPO/DAPO/dual-clip/GSPO), value loss, KL."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_jax import losses

RATIOS = jnp.array([[0.5, 1.1, 1.5, 0.5, 1.1, 4.0]])
ADVANTAGES = jnp.array([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])


def test_clipped_surrogate_literal():
    logp = jnp.log(RATIOS)
    old_logp = jnp.zeros_like(logp)
    loss, clipped = losses.clipped_surrogate(
        logp, old_logp, ADVANTAGES, epsilon=0.2, epsilon_high=0.3
    )
    # A>0: -r unless r > 1.3 (-> -1.3); A<0: r unless r < 0.8 (-> 0.8).
    np.testing.assert_allclose(loss, [[-0.5, -1.1, -1.3, 0.8, 1.1, 4.0]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[False, False, True, True, False, False]])
    loss, clipped = losses.clipped_surrogate(
        logp, old_logp, ADVANTAGES, epsilon=0.2, epsilon_high=0.3, dual_clip=3.0
    )
    # Dual clip bounds the negative-advantage loss by -3 A = 3.
    np.testing.assert_allclose(loss, [[-0.5, -1.1, -1.3, 0.8, 1.1, 3.0]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[False, False, True, True, False, True]])
    # Symmetric clip: 1.5 -> 1.2.
    loss, _ = losses.clipped_surrogate(logp, old_logp, ADVANTAGES, epsilon=0.2)
    np.testing.assert_allclose(loss[0, 2], -1.2, rtol=1e-6)


def test_gspo_sequence_ratio_literal():
    logp = jnp.array([[0.2, -0.4, 7.0]])
    old_logp = jnp.zeros_like(logp)
    mask = jnp.array([[True, True, False]])
    # s = exp(mean(0.2, -0.4)) = exp(-0.1) = 0.9048374 for every token.
    loss, clipped = losses.clipped_surrogate(
        logp, old_logp, jnp.ones((1, 3)), epsilon=0.05, mask=mask, ratio_level="sequence"
    )
    np.testing.assert_allclose(loss, [[-0.9048374] * 3], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[False, False, False]])
    grad = jax.grad(
        lambda lp: losses.aggregate(
            losses.clipped_surrogate(
                lp, old_logp, jnp.ones((1, 3)), epsilon=0.05, mask=mask, ratio_level="sequence"
            )[0],
            mask,
            mode="seq-mean-token-mean",
        )
    )(logp)
    np.testing.assert_allclose(grad, [[-0.9048374 / 2, -0.9048374 / 2, 0.0]], rtol=1e-6)
    # Negative advantage: s < 0.95 binds; loss -0.95 * A = 0.95, clipped on valid tokens only.
    loss, clipped = losses.clipped_surrogate(
        logp, old_logp, -jnp.ones((1, 3)), epsilon=0.05, mask=mask, ratio_level="sequence"
    )
    np.testing.assert_allclose(loss, [[0.95] * 3], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[True, True, False]])
    with pytest.raises(ValueError, match="needs `mask`"):
        losses.clipped_surrogate(
            logp, old_logp, jnp.ones((1, 3)), epsilon=0.05, ratio_level="sequence"
        )


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("epsilon_high", [None, 0.28])
def test_clipped_surrogate_matches_min_formula_and_gradient_zero_where_clipped(
    dual_clip, epsilon_high
):
    keys = jax.random.split(jax.random.key(0), 3)
    logp = jax.random.normal(keys[0], (4, 16)) * 0.6
    old_logp = jax.random.normal(keys[1], (4, 16)) * 0.6
    advantages = jax.random.normal(keys[2], (4, 16))
    eps, eps_high = 0.2, 0.2 if epsilon_high is None else epsilon_high

    def total(lp):
        loss, _ = losses.clipped_surrogate(
            lp, old_logp, advantages, epsilon=0.2, epsilon_high=epsilon_high, dual_clip=dual_clip
        )
        return loss.sum()

    loss, clipped = losses.clipped_surrogate(
        logp, old_logp, advantages, epsilon=0.2, epsilon_high=epsilon_high, dual_clip=dual_clip
    )
    r, a = np.exp(np.asarray(logp - old_logp)), np.asarray(advantages)
    objective = np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps_high) * a)
    if dual_clip is not None:
        objective = np.where(a < 0, np.maximum(objective, dual_clip * a), objective)
    np.testing.assert_allclose(loss, -objective, rtol=1e-5, atol=1e-6)

    grad = np.asarray(jax.grad(total)(logp))
    clipped = np.asarray(clipped)
    assert clipped.any() and (~clipped).any()
    np.testing.assert_array_equal(grad[clipped], 0.0)  # exactly zero
    np.testing.assert_allclose(grad[~clipped], (-a * r)[~clipped], rtol=1e-5)
    # The clip binds only on the side that matches the advantage's sign (+ the dual bound).
    expected = ((a > 0) & (r > 1 + eps_high)) | ((a < 0) & (r < 1 - eps))
    if dual_clip is not None:
        expected |= (a < 0) & (r > dual_clip)
    np.testing.assert_array_equal(clipped, expected)


def test_value_loss_literal():
    values, old, returns = jnp.array([1.0, 1.0]), jnp.array([0.0, 0.8]), jnp.array([2.0, 0.0])
    # t0: max((1-2)^2, (0.2-2)^2) / 2 = 1.62; t1: max(1, (1.0-0)^2) / 2 = 0.5.
    np.testing.assert_allclose(
        losses.value_loss(values, old, returns, clip=0.2), [1.62, 0.5], rtol=1e-6
    )
    np.testing.assert_allclose(losses.value_loss(values, old, returns, clip=None), [0.5, 0.5])


def test_kl_penalty_literal():
    logp, ref_logp = jnp.array([-1.0, -2.0]), jnp.array([-2.0, -1.0])
    np.testing.assert_allclose(losses.kl_penalty(logp, ref_logp, kind="k1"), [1.0, -1.0])
    np.testing.assert_allclose(losses.kl_penalty(logp, ref_logp, kind="k2"), [0.5, 0.5])
    # d = [-1, 1]: e^-1 - 1 + 1 = 0.36787944, e - 1 - 1 = 0.71828183.
    np.testing.assert_allclose(
        losses.kl_penalty(logp, ref_logp, kind="k3"), [0.36787944, 0.71828183], rtol=1e-6
    )


def test_full_kl_literal():
    # p = [.5, .5], q = [.25, .75]: .5 ln 2 + .5 ln(2/3) = .5 ln(4/3) = 0.14384104.
    kl = losses.full_kl(jnp.array([[0.0, 0.0]]), jnp.array([[0.0, np.log(3.0)]]))
    np.testing.assert_allclose(kl, [0.14384104], rtol=1e-6)
    # A vocabulary entry with zero probability contributes 0 (no 0 * inf = NaN).
    kl = losses.full_kl(jnp.array([[0.0, 0.0, -jnp.inf]]), jnp.array([[0.0, np.log(3.0), 0.0]]))
    np.testing.assert_allclose(kl, [0.5 * np.log(0.5 / 0.2) + 0.5 * np.log(0.5 / 0.6)], rtol=1e-6)


def test_k3_and_k1_expectations_equal_exact_kl():
    """E_{a ~ pi}[k(a)] = KL(pi || ref) for k1 and k3, exactly, over a small vocabulary."""
    keys = jax.random.split(jax.random.key(4), 2)
    logits = jax.random.normal(keys[0], (3, 5)) * 2.0
    ref_logits = jax.random.normal(keys[1], (3, 5)) * 2.0
    logp = jax.nn.log_softmax(logits)
    ref_logp = jax.nn.log_softmax(ref_logits)
    exact = losses.full_kl(logits, ref_logits)
    independent = np.sum(np.exp(logp) * (logp - ref_logp), axis=-1)
    np.testing.assert_allclose(exact, independent, rtol=1e-5)
    for kind in ("k1", "k3"):
        expectation = jnp.sum(jnp.exp(logp) * losses.kl_penalty(logp, ref_logp, kind=kind), -1)
        np.testing.assert_allclose(expectation, exact, rtol=1e-5, atol=1e-6)
    # k2's expectation is only a second-order approximation: it differs here.
    k2 = jnp.sum(jnp.exp(logp) * losses.kl_penalty(logp, ref_logp, kind="k2"), -1)
    assert np.all(np.abs(k2 - exact) > 1e-4)


def test_k3_is_not_negative_from_cancellation():
    # Tiny log-ratios: ratio - log(ratio) - 1 written naively cancels; expm1 keeps d^2/2.
    d = jnp.array([1e-4, -1e-4, 3e-3, 1e-7])
    k3 = losses.kl_penalty(jnp.zeros(4), d, kind="k3")
    assert np.all(np.asarray(k3) >= 0)
    # float32 keeps the absolute error near ulp(d) * |d|; the value is never below 0.
    np.testing.assert_allclose(k3, d**2 / 2 + d**3 / 6, rtol=1e-3, atol=1e-11)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-30, 30, width=32), min_size=4, max_size=4),
    st.lists(st.floats(-30, 30, width=32), min_size=4, max_size=4),
)
def test_k3_nonnegative_property(logp, ref_logp):
    k3 = losses.kl_penalty(jnp.array(logp), jnp.array(ref_logp), kind="k3")
    assert np.all(np.asarray(k3) >= 0)


def test_bad_options_give_value_errors():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="`kind` must be one of"):
        losses.kl_penalty(x, x, kind="k4")
    with pytest.raises(ValueError, match="`dual_clip` must be > 1"):
        losses.clipped_surrogate(x, x, x, epsilon=0.2, dual_clip=0.5)
    with pytest.raises(ValueError, match="`ratio_level` must be one of"):
        losses.clipped_surrogate(x, x, x, epsilon=0.2, ratio_level="chunk")
    with pytest.raises(ValueError, match="logp, old_logp, advantages must have the same shape"):
        losses.clipped_surrogate(x, jnp.zeros((2, 2)), x, epsilon=0.2)
    with pytest.raises(ValueError, match="`clip` must be > 0"):
        losses.value_loss(x, x, x, clip=0.0)


def test_kl_estimators_as_losses_have_the_gradients_the_docstring_says():
    """Exact expectations over a 6-symbol policy: E_pi[grad k(x)] with the sampled x held
    fixed is 0 for k1, grad KL(pi || ref) for k2 and grad KL(ref || pi) for k3."""
    theta = jnp.asarray([0.3, -1.2, 0.8, 0.0, 2.0, -0.5])
    ref_logp = jax.nn.log_softmax(jnp.asarray([1.0, 0.2, -0.7, 0.4, 0.1, -1.5]))

    def expected_grad(kind):
        weights = jax.nn.softmax(theta)  # the sampling distribution: no gradient through it

        def loss(t):
            logp = jax.nn.log_softmax(t)
            return jnp.sum(weights * losses.kl_penalty(logp, ref_logp, kind=kind))

        return jax.grad(loss)(theta)

    def reverse_kl(t):  # KL(pi || ref)
        logp = jax.nn.log_softmax(t)
        return jnp.sum(jnp.exp(logp) * (logp - ref_logp))

    def forward_kl(t):  # KL(ref || pi)
        return jnp.sum(jnp.exp(ref_logp) * (ref_logp - jax.nn.log_softmax(t)))

    np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
    np.testing.assert_allclose(expected_grad("k2"), jax.grad(reverse_kl)(theta), atol=1e-6)
    np.testing.assert_allclose(expected_grad("k3"), jax.grad(forward_kl)(theta), atol=1e-6)
    # The two directions differ here, so the test tells k2 from k3.
    assert np.abs(jax.grad(reverse_kl)(theta) - jax.grad(forward_kl)(theta)).max() > 0.05


def test_k1_in_the_loss_is_warned_about():
    from configs import default as default_config
    from grpo_jax.stages.rl import kl_warning, summary

    section = default_config.get_config("smoke").rl
    assert kl_warning(section) is None  # GRPO: k3 in the loss
    section.kl_kind = "k1"
    assert "zero gradient in expectation" in kl_warning(section)
    assert "warning: kl_kind k1" in summary(section)
    section.beta = 0.0
    assert kl_warning(section) is None  # no KL term at all
    section.algorithm, section.beta = "reinforce_pp", None  # k1 in the reward: fine
    assert kl_warning(section) is None
