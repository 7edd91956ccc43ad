"""Tests for grpo_jax.losses TRPO pieces: CG, Fisher-vector products, natural step, search."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from grpo_jax import losses


def test_conjugate_gradient_literal():
    a = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    x = losses.conjugate_gradient(lambda v: a @ v, jnp.array([1.0, 2.0]), iters=2)
    np.testing.assert_allclose(x, [1.0 / 11.0, 7.0 / 11.0], rtol=1e-5)  # A^{-1} b by hand
    np.testing.assert_array_equal(
        losses.conjugate_gradient(lambda v: a @ v, jnp.zeros(2)), [0.0, 0.0]
    )


def test_conjugate_gradient_random_spd_flat_and_pytree():
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (6, 6))
    spd = q @ q.T + 6.0 * jnp.eye(6)
    b = jax.random.normal(keys[1], (6,))
    x = losses.conjugate_gradient(lambda v: spd @ v, b, iters=6)
    np.testing.assert_allclose(
        x, np.linalg.solve(np.asarray(spd, np.float64), np.asarray(b)), rtol=1e-4, atol=1e-5
    )
    # The same system as a pytree {"a": [2], "b": [2, 2]}.
    _, unravel = ravel_pytree({"a": jnp.zeros(2), "b": jnp.zeros((2, 2))})

    def tree_matvec(tree):
        flat, _ = ravel_pytree(tree)
        return unravel(spd @ flat)

    x_tree = losses.conjugate_gradient(tree_matvec, unravel(b), iters=6)
    np.testing.assert_allclose(ravel_pytree(x_tree)[0], x, rtol=1e-5, atol=1e-6)


def _linear_softmax():
    """pi(a|s) = softmax(x_s W + c) over 3 actions, 4 states with 2 features."""
    keys = jax.random.split(jax.random.key(1), 4)
    states = jax.random.normal(keys[0], (4, 2))
    params = {"w": jax.random.normal(keys[1], (2, 3)), "c": jax.random.normal(keys[2], (3,))}

    def logits_fn(p):
        return states @ p["w"] + p["c"]

    old_logits = logits_fn(params)

    def kl_fn(p):  # mean KL(pi_old || pi_p), minimised (= 0) at p = params
        return jnp.mean(losses.full_kl(old_logits, logits_fn(p)))

    return params, logits_fn, kl_fn


def _explicit_fisher(params, logits_fn):
    flat, unravel = ravel_pytree(params)
    logp = jax.nn.log_softmax(logits_fn(params))  # [S, A]
    scores = jax.jacobian(lambda f: jax.nn.log_softmax(logits_fn(unravel(f))))(flat)  # [S,A,P]
    probs = np.exp(np.asarray(logp, np.float64))
    scores = np.asarray(scores, np.float64)
    return np.einsum("sa,sap,saq->pq", probs, scores, scores) / probs.shape[0]


def test_fisher_vector_product_literal():
    # Softmax logits at 0 over 2 actions: F = diag(p) - p p^T = [[.25, -.25], [-.25, .25]].
    old = jnp.zeros(2)
    kl_fn = lambda theta: losses.full_kl(old, theta)
    v = jnp.array([1.0, 0.0])
    np.testing.assert_allclose(
        losses.fisher_vector_product(kl_fn, old, v), [0.25, -0.25], rtol=1e-6
    )
    np.testing.assert_allclose(
        losses.fisher_vector_product(kl_fn, old, v, damping=0.1), [0.35, -0.25], rtol=1e-6
    )


def test_fisher_vector_product_equals_explicit_fisher_times_v():
    params, logits_fn, kl_fn = _linear_softmax()
    fisher = _explicit_fisher(params, logits_fn)
    flat, unravel = ravel_pytree(params)
    for seed in range(3):
        v_flat = jax.random.normal(jax.random.key(10 + seed), flat.shape)
        fvp = losses.fisher_vector_product(kl_fn, params, unravel(v_flat))
        np.testing.assert_allclose(
            ravel_pytree(fvp)[0], fisher @ np.asarray(v_flat), rtol=1e-4, atol=1e-5
        )


def test_categorical_fisher_operator_equals_explicit_fisher_times_v():
    params, logits_fn, _ = _linear_softmax()
    fisher = _explicit_fisher(params, logits_fn)
    fvp, logits = losses.categorical_fisher_operator(logits_fn, params, jnp.full((4,), 0.25))
    np.testing.assert_allclose(logits, logits_fn(params), rtol=1e-6)
    flat, unravel = ravel_pytree(params)
    for seed in range(3):
        v_flat = jax.random.normal(jax.random.key(20 + seed), flat.shape)
        np.testing.assert_allclose(ravel_pytree(fvp(unravel(v_flat)))[0],
                                   fisher @ np.asarray(v_flat), rtol=1e-4, atol=1e-5)


def test_categorical_fisher_operator_is_the_kl_hessian_of_a_nonlinear_model():
    # A tanh network over [2, 5] positions with weights that zero some positions: the
    # Gauss-Newton product equals forward-over-reverse on the weighted KL, damping included.
    keys = jax.random.split(jax.random.key(3), 5)
    x = jax.random.normal(keys[0], (2, 5, 3))
    params = {"w1": jax.random.normal(keys[1], (3, 6)), "w2": jax.random.normal(keys[2], (6, 4))}
    weights = jnp.array([[0.3, 0.0, 0.1, 0.2, 0.0], [0.1, 0.1, 0.0, 0.2, 0.0]])

    def logits_fn(p):
        return jnp.tanh(x @ p["w1"]) @ p["w2"]

    old = logits_fn(params)

    def kl_fn(p):
        return jnp.sum(weights * losses.full_kl(old, logits_fn(p)))

    fvp, _ = losses.categorical_fisher_operator(logits_fn, params, weights, damping=0.05)
    flat, unravel = ravel_pytree(params)
    v = unravel(jax.random.normal(keys[3], flat.shape))
    expected = losses.fisher_vector_product(kl_fn, params, v, damping=0.05)
    np.testing.assert_allclose(ravel_pytree(fvp(v))[0], ravel_pytree(expected)[0],
                               rtol=1e-4, atol=1e-6)


def test_categorical_fisher_operator_rejects_misshapen_weights():
    params, logits_fn, _ = _linear_softmax()
    with pytest.raises(ValueError, match=r"`weights` must have .*\(4,\), got \(3,\)"):
        losses.categorical_fisher_operator(logits_fn, params, jnp.ones((3,)))


def test_natural_gradient_step_literal():
    fvp = lambda v: jnp.array([2.0, 8.0]) * v
    # x = F^{-1} g = [.5, .125], x^T F x = .625, scale sqrt(.02 / .625) = 0.17888544.
    step = losses.natural_gradient_step(jnp.array([1.0, 1.0]), fvp, max_kl=0.01)
    np.testing.assert_allclose(step, [0.08944272, 0.02236068], rtol=1e-5)


def test_natural_gradient_step_on_softmax_policy():
    params, logits_fn, kl_fn = _linear_softmax()
    damping, delta = 1e-2, 0.005
    fvp = functools.partial(losses.fisher_vector_product, kl_fn, params, damping=damping)
    flat, unravel = ravel_pytree(params)
    grad = unravel(jax.random.normal(jax.random.key(7), flat.shape))
    step = losses.natural_gradient_step(grad, fvp, max_kl=delta, cg_iters=flat.size)
    step_flat = np.asarray(ravel_pytree(step)[0], np.float64)
    damped = _explicit_fisher(params, logits_fn) + damping * np.eye(flat.size)
    np.testing.assert_allclose(0.5 * step_flat @ damped @ step_flat, delta, rtol=1e-3)
    direction = np.linalg.solve(damped, np.asarray(ravel_pytree(grad)[0], np.float64))
    cosine = direction @ step_flat / np.linalg.norm(direction) / np.linalg.norm(step_flat)
    np.testing.assert_allclose(cosine, 1.0, atol=1e-4)


def test_backtracking_line_search_literal():
    objective = lambda x: -((x - 1.0) ** 2)
    constraint = lambda x: 0.5 * x**2
    # Full step 4 (expected g.d = 2 * 4 = 8): x=4 loses 8; x=2 gains 0; x=1 gains 1 > 0 with
    # ratio 1 / (0.25 * 8) = 0.5 > 0.1 and constraint 0.5 <= 1: accepted at fraction 0.25.
    result = losses.backtracking_line_search(
        objective, constraint, jnp.array(0.0), jnp.array(4.0), max_kl=1.0, expected_improvement=8.0
    )
    assert bool(result.accepted)
    np.testing.assert_allclose(result.params, 1.0)
    np.testing.assert_allclose(result.step_fraction, 0.25)
    np.testing.assert_allclose(result.improvement, 1.0)
    np.testing.assert_allclose(result.constraint, 0.5)
    # A tighter constraint (x^2 / 2 <= 0.1) pushes it to x = 0.25 (gain 0.4375, ratio 0.875).
    result = losses.backtracking_line_search(
        objective, constraint, jnp.array(0.0), jnp.array(4.0), max_kl=0.1, expected_improvement=8.0
    )
    np.testing.assert_allclose(result.params, 0.25)
    np.testing.assert_allclose(result.step_fraction, 1.0 / 16.0)
    # A step in the wrong direction is never accepted: the parameters stay.
    result = losses.backtracking_line_search(
        objective,
        constraint,
        jnp.array(0.0),
        jnp.array(-4.0),
        max_kl=1.0,
        expected_improvement=8.0,
        max_backtracks=5,
    )
    assert not bool(result.accepted)
    np.testing.assert_allclose(result.params, 0.0)
    np.testing.assert_allclose(result.step_fraction, 0.0)


def test_trpo_iteration_improves_surrogate_within_trust_region():
    """One full TRPO update on the softmax policy: improvement > 0 and KL <= delta."""
    params, logits_fn, kl_fn = _linear_softmax()
    rewards = jax.random.normal(jax.random.key(3), (4, 3))
    old_logp = jax.lax.stop_gradient(jax.nn.log_softmax(logits_fn(params)))

    def surrogate(p):  # exact E_{a ~ pi_old}[ratio * A]
        logp = jax.nn.log_softmax(logits_fn(p))
        advantages = rewards - jnp.sum(jnp.exp(old_logp) * rewards, -1, keepdims=True)
        return -jnp.mean(
            jnp.sum(
                jnp.exp(old_logp)
                * losses.clipped_surrogate(logp, old_logp, advantages, epsilon=1e9)[0],
                -1,
            )
        )

    delta = 0.01
    grad = jax.grad(surrogate)(params)
    fvp = functools.partial(losses.fisher_vector_product, kl_fn, params, damping=1e-3)
    step = losses.natural_gradient_step(grad, fvp, max_kl=delta)
    expected = sum(jax.tree.leaves(jax.tree.map(jnp.vdot, grad, step)))
    result = jax.jit(
        lambda p, s: losses.backtracking_line_search(
            surrogate, kl_fn, p, s, max_kl=delta, expected_improvement=expected
        )
    )(params, step)
    assert bool(result.accepted)
    assert float(result.improvement) > 0
    # The quadratic model put the full step on the trust-region boundary: the KL is near delta.
    assert 0.5 * delta <= float(kl_fn(result.params)) <= delta


def test_trpo_pieces_keep_bfloat16_parameters():
    a = jnp.array([[4.0, 1.0], [1.0, 3.0]], jnp.bfloat16)
    b = {"w": jnp.array([1.0, 2.0], jnp.bfloat16)}
    matvec = lambda v: {"w": a @ v["w"]}
    x = jax.jit(lambda b: losses.conjugate_gradient(matvec, b, iters=2))(b)
    assert x["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(x["w"].astype(jnp.float32), [1.0 / 11.0, 7.0 / 11.0], rtol=3e-2)
    step = losses.natural_gradient_step(b, matvec, max_kl=0.01)
    assert step["w"].dtype == jnp.bfloat16
    result = losses.backtracking_line_search(
        lambda p: -jnp.sum((p["w"].astype(jnp.float32) - 1.0) ** 2),
        lambda p: 0.5 * jnp.sum(p["w"].astype(jnp.float32) ** 2),
        {"w": jnp.zeros(2, jnp.bfloat16)},
        {"w": jnp.full(2, 4.0, jnp.bfloat16)},
        max_kl=1.0,
        expected_improvement=16.0,
    )
    assert result.params["w"].dtype == jnp.bfloat16
    # As the literal test per coordinate: x = (1, 1) gains 2 of 0.25 * 16, constraint 1 <= 1.
    np.testing.assert_allclose(result.params["w"].astype(jnp.float32), [1.0, 1.0])
