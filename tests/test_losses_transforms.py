"""Every grpo_jax.losses kernel under jax.jit and jax.vmap, and check_grads on each
differentiable kernel."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from grpo_jax import losses

B, T = 2, 5


def _normal(key, shape, scale=1.0):
    return jax.random.normal(key, shape) * scale


def _mask(key, batch=B, length=T):
    lengths = jax.random.randint(key, (batch,), 1, length + 1)
    return jnp.arange(length)[None, :] < lengths[:, None]


def _trajectory(key):
    k = jax.random.split(key, 3)
    return (
        _normal(k[0], (T,)),
        _normal(k[1], (T + 1,)),
        jax.random.uniform(k[2], (T,), minval=0.5, maxval=1.0),
    )


def _token_batch(key, n=4):
    """(logp, old_logp, advantages, mask), the first `n` of them."""
    k = jax.random.split(key, 4)
    batch = (
        _normal(k[0], (B, T), 0.3),
        _normal(k[1], (B, T), 0.3),
        _normal(k[2], (B, T)),
        _mask(k[3]),
    )
    return batch[:n]


SPD = jnp.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]])


def _fvp(theta, v):
    old = jax.lax.stop_gradient(theta)
    return losses.fisher_vector_product(
        lambda p: jnp.sum(losses.full_kl(old, p)), theta, v, damping=0.1
    )


def _line_search(start, step):
    return losses.backtracking_line_search(
        lambda x: -jnp.sum((x - 1.0) ** 2),
        lambda x: 0.5 * jnp.sum(x**2),
        start,
        step,
        max_kl=2.0,
        expected_improvement=-2.0 * jnp.vdot(start - 1.0, step),
    )


# name -> (function, make_args(key) -> tuple of arrays)
CASES = {
    "policy_gradient": (losses.policy_gradient, lambda k: _token_batch(k, 2)),
    **{
        f"group_advantages[{s}]": (
            functools.partial(losses.group_advantages, group_size=4, scale=s),
            lambda k: (jax.random.bernoulli(k, 0.5, (8,)).astype(jnp.float32),),
        )
        for s in ("group", "batch", "none")
    },
    "rloo_advantages": (
        functools.partial(losses.rloo_advantages, group_size=4),
        lambda k: (_normal(k, (8,)),),
    ),
    "optimal_baseline": (
        losses.optimal_baseline,
        lambda k: (_normal(k, (6,)), jnp.abs(_normal(jax.random.fold_in(k, 1), (6,))) + 0.1),
    ),
    "whiten": (losses.whiten, lambda k: (_normal(k, (B, T)), _mask(jax.random.fold_in(k, 1)))),
    "td_residuals": (losses.td_residuals, _trajectory),
    "discounted_returns": (
        lambda r, v, d: losses.discounted_returns(r, d, bootstrap_value=v[-1]),
        _trajectory,
    ),
    "gae": (functools.partial(losses.gae, lambda_=0.9), _trajectory),
    "kstep_advantages": (functools.partial(losses.kstep_advantages, k=2), _trajectory),
    "token_gae": (
        functools.partial(losses.token_gae, gamma=0.99, lambda_=0.95),
        lambda k: _token_batch(k, 4)[1:],
    ),
    "clipped_surrogate[token]": (
        functools.partial(losses.clipped_surrogate, epsilon=0.2, epsilon_high=0.28, dual_clip=3.0),
        lambda k: _token_batch(k, 3),
    ),
    "clipped_surrogate[sequence]": (
        lambda lp, old, a, m: losses.clipped_surrogate(
            lp, old, a, epsilon=0.1, mask=m, ratio_level="sequence"
        ),
        lambda k: _token_batch(k, 4),
    ),
    "value_loss": (functools.partial(losses.value_loss, clip=0.2), lambda k: _token_batch(k, 3)),
    **{
        f"kl_penalty[{kind}]": (
            functools.partial(losses.kl_penalty, kind=kind),
            lambda k: _token_batch(k, 2),
        )
        for kind in ("k1", "k2", "k3")
    },
    "full_kl": (
        losses.full_kl,
        lambda k: (_normal(k, (B, T, 4)), _normal(jax.random.fold_in(k, 1), (B, T, 4))),
    ),
    **{
        f"aggregate[{mode}]": (
            functools.partial(losses.aggregate, mode=mode),
            lambda k: (_normal(k, (B, T)), _mask(jax.random.fold_in(k, 1))),
        )
        for mode in losses.AGGREGATION_MODES
    },
    "conjugate_gradient": (
        lambda b: losses.conjugate_gradient(lambda v: SPD @ v, b, iters=3),
        lambda k: (_normal(k, (3,)),),
    ),
    "fisher_vector_product": (
        _fvp,
        lambda k: (_normal(k, (4,)), _normal(jax.random.fold_in(k, 1), (4,))),
    ),
    "natural_gradient_step": (
        lambda g, diag: losses.natural_gradient_step(g, lambda v: diag * v, max_kl=0.01),
        lambda k: (_normal(k, (3,)), jax.random.uniform(jax.random.fold_in(k, 1), (3,)) + 0.5),
    ),
    "backtracking_line_search": (
        _line_search,
        lambda k: (_normal(k, (2,)), _normal(jax.random.fold_in(k, 1), (2,))),
    ),
}


def _assert_trees_close(actual, expected):
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6), actual, expected
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_and_vmap(name):
    fn, make_args = CASES[name]
    keys = jax.random.split(jax.random.key(0), 3)
    examples = [make_args(k) for k in keys]
    jitted = jax.jit(fn)
    per_example = [jitted(*args) for args in examples]
    _assert_trees_close(per_example[0], fn(*examples[0]))  # jit == eager
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *examples)
    batched = jax.jit(jax.vmap(fn))(*stacked)
    _assert_trees_close(batched, jax.tree.map(lambda *xs: jnp.stack(xs), *per_example))


# name -> (function of the differentiable arguments only, args, modes)
KEY = jax.random.key(42)
_TOKENS = _token_batch(KEY, 4)
_LOGP, _OLD, _ADV, _MASK = _TOKENS
_R, _V, _D = _trajectory(KEY)
GRAD_CASES = {
    "policy_gradient": (lambda lp: losses.policy_gradient(lp, _ADV), (_LOGP,)),
    "group_advantages": (lambda r: losses.group_advantages(r, group_size=4), (_normal(KEY, (8,)),)),
    "group_advantages[batch]": (
        lambda r: losses.group_advantages(r, group_size=4, scale="batch"),
        (_normal(KEY, (8,)),),
    ),
    "rloo_advantages": (lambda r: losses.rloo_advantages(r, group_size=4), (_normal(KEY, (8,)),)),
    "optimal_baseline": (
        losses.optimal_baseline,
        (_normal(KEY, (6,)), jnp.abs(_normal(KEY, (6,))) + 0.5),
    ),
    "whiten": (lambda x: losses.whiten(x, _MASK), (_normal(KEY, (B, T)),)),
    "td_residuals": (losses.td_residuals, (_R, _V, _D)),
    "discounted_returns": (
        lambda r, d, b: losses.discounted_returns(r, d, bootstrap_value=b),
        (_R, _D, _V[-1]),
    ),
    "gae": (functools.partial(losses.gae, lambda_=0.9), (_R, _V, _D)),
    "kstep_advantages": (functools.partial(losses.kstep_advantages, k=3), (_R, _V, _D)),
    "token_gae": (
        lambda r, v: losses.token_gae(r, v, _MASK, gamma=0.99, lambda_=0.95),
        (_normal(KEY, (B, T)), _normal(jax.random.fold_in(KEY, 1), (B, T))),
    ),
    "clipped_surrogate[token]": (
        lambda lp: losses.clipped_surrogate(lp, _OLD, _ADV, epsilon=0.2, dual_clip=3.0)[0],
        (_LOGP,),
    ),
    "clipped_surrogate[sequence]": (
        lambda lp: losses.clipped_surrogate(
            lp, _OLD, _ADV, epsilon=0.2, mask=_MASK, ratio_level="sequence"
        )[0],
        (_LOGP,),
    ),
    "value_loss": (lambda v: losses.value_loss(v, _OLD, _ADV, clip=0.2), (_LOGP,)),
    **{
        f"kl_penalty[{kind}]": (
            lambda lp, ref, kind=kind: losses.kl_penalty(lp, ref, kind=kind),
            (_LOGP, _OLD),
        )
        for kind in ("k1", "k2", "k3")
    },
    "full_kl": (
        losses.full_kl,
        (_normal(KEY, (B, 3)), _normal(jax.random.fold_in(KEY, 1), (B, 3))),
    ),
    **{
        f"aggregate[{mode}]": (
            lambda x, mode=mode: losses.aggregate(x, _MASK, mode=mode),
            (_normal(KEY, (B, T)),),
        )
        for mode in losses.AGGREGATION_MODES
    },
    "fisher_vector_product": (
        _fvp,
        (_normal(KEY, (3,)), _normal(jax.random.fold_in(KEY, 1), (3,))),
    ),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_check_grads(name):
    fn, args = GRAD_CASES[name]
    check_grads(jax.jit(fn), args, order=1, modes=("fwd", "rev"), atol=1e-2, rtol=1e-2, eps=1e-3)


def test_check_grads_conjugate_gradient_forward_mode():
    # lax.while_loop is forward-differentiable only; CG is linear in b for a fixed iteration
    # count, and exact here after 3 iterations, so d x / d b = SPD^{-1}.
    fn = lambda b: losses.conjugate_gradient(lambda v: SPD @ v, b, iters=3)
    b = _normal(KEY, (3,))
    check_grads(fn, (b,), order=1, modes=("fwd",), atol=1e-2, rtol=1e-2, eps=1e-3)
    np.testing.assert_allclose(
        jax.jacfwd(fn)(b), np.linalg.inv(np.asarray(SPD)), rtol=1e-4, atol=1e-5
    )
