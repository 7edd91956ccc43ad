"""Trust-region pieces: conjugate gradient, Fisher-vector products, natural step, line search.

Every function works on pytrees of parameters (flat arrays are the one-leaf case) and is
jittable; the Fisher matrix is never formed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax.tree_utils as otu

PyTree = Any


def _add_scaled(tree_x: PyTree, scalar, tree_y: PyTree) -> PyTree:
    """x + scalar * y leaf by leaf, keeping each leaf of x's dtype (bf16 parameters stay)."""
    return jax.tree.map(lambda x, y: (x + scalar * y).astype(x.dtype), tree_x, tree_y)


def _vdot(tree_x: PyTree, tree_y: PyTree) -> jax.Array:
    """Inner product of two pytrees, accumulated in at least float32."""

    def leaf(x, y):
        dtype = jnp.promote_types(x.dtype, jnp.float32)
        return jnp.vdot(x.astype(dtype), y.astype(dtype))

    return sum(jax.tree.leaves(jax.tree.map(leaf, tree_x, tree_y)))


def conjugate_gradient(
    matvec: Callable[[PyTree], PyTree], b: PyTree, *, iters: int = 10, tol: float = 1e-10
) -> PyTree:
    """Solve A x = b for symmetric positive-definite A given only x -> A x.

    Conjugate gradient from x_0 = 0: alpha_k = r_k.r_k / p_k.A p_k,
    x_{k+1} = x_k + alpha_k p_k, r_{k+1} = r_k - alpha_k A p_k,
    p_{k+1} = r_{k+1} + (r_{k+1}.r_{k+1} / r_k.r_k) p_k; stops after `iters` steps or when
    r.r <= `tol` (Hestenes & Stiefel 1952, https://doi.org/10.6028/jres.049.044; used by
    TRPO, Schulman et al. 2015, https://arxiv.org/abs/1502.05477, appendix C).

    Args:
      matvec: function v -> A v on pytrees shaped like `b`.
      b: right-hand side, a pytree (e.g. a flat [P] array or a parameter tree).
      iters: maximum number of iterations (exact in at most P steps for P unknowns).
      tol: stop once the squared residual norm r.r is at most this.

    Returns:
      x, a pytree shaped like `b`.
    """
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f"conjugate_gradient: `iters` must be an int >= 0, got {iters!r}")
    x = otu.tree_zeros_like(b)
    rr = _vdot(b, b)

    def cond(state):
        i, _, _, _, rr = state
        return (i < iters) & (rr > tol)

    def body(state):
        i, x, r, p, rr = state
        a_p = matvec(p)
        alpha = rr / _vdot(p, a_p)
        x = _add_scaled(x, alpha, p)
        r = _add_scaled(r, -alpha, a_p)
        rr_new = _vdot(r, r)
        p = _add_scaled(r, rr_new / rr, p)
        return i + 1, x, r, p, rr_new

    _, x, _, _, _ = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), x, b, b, rr))
    return x


def fisher_vector_product(
    kl_fn: Callable[[PyTree], jax.Array], params: PyTree, v: PyTree, *, damping: float = 0.0
) -> PyTree:
    """Fisher-vector product as the Hessian of the mean KL times v, by forward-over-reverse.

    F v = d/de grad KL(pi_old || pi_{params + e v}) at e = 0, + damping v, where
    `kl_fn(params)` is the mean KL from the (fixed) old policy, minimised at `params`; there
    its Hessian equals the Fisher information matrix (Schulman et al. 2015,
    https://arxiv.org/abs/1502.05477, appendix C; Pearlmutter 1994,
    https://doi.org/10.1162/neco.1994.6.1.147).

    Args:
      kl_fn: params -> scalar mean KL from the old policy.
      params: the parameters at which to evaluate (the old policy's), a pytree.
      v: a pytree shaped like `params`.
      damping: added multiple of v (Tikhonov damping).

    Returns:
      F v, a pytree shaped like `params`.
    """
    _, hvp = jax.jvp(jax.grad(kl_fn), (params,), (v,))
    if damping:
        hvp = _add_scaled(hvp, damping, v)
    return hvp


def categorical_fisher_operator(
    logits_fn: Callable[[PyTree], jax.Array],
    params: PyTree,
    weights: jax.Array,
    *,
    damping: float = 0.0,
) -> tuple[Callable[[PyTree], PyTree], jax.Array]:
    """v -> F v for a categorical policy's Fisher, with the network linearised once.

    F = J^T H J + damping I, where J = d logits / d params at `params` and, per position t,
    H_t = weights_t (diag p_t - p_t p_t^T) with p_t = softmax(logits_t): the Hessian in the
    logits of sum_t weights_t KL(softmax(logits_old_t) || softmax(logits_t)) at
    logits = logits_old. The KL's gradient in the logits is zero there, so this Gauss-Newton
    form is the exact Hessian of that KL in the parameters, the same F v as
    `fisher_vector_product` of it (Martens & Grosse 2015, https://arxiv.org/abs/1503.05671,
    section 9; Schulman et al. 2015, https://arxiv.org/abs/1502.05477, appendix C). Each
    product is one Jacobian-vector and one transposed product of the stored linearisation,
    about half the cost of forward-over-reverse, and the logits come back for reuse.

    Args:
      logits_fn: params -> [..., V] logits.
      params: the parameters at which F is taken (the old policy's), a pytree.
      weights: [...] per-position weights (e.g. mask / number of tokens for the mean KL).
      damping: added multiple of v (Tikhonov damping).

    Returns:
      (fvp, logits): fvp maps a pytree shaped like `params` to F v; logits = logits_fn(params).
    """
    logits, jvp_fn = jax.linearize(logits_fn, params)
    weights = jnp.asarray(weights, jnp.float32)
    if weights.shape != logits.shape[:-1]:
        raise ValueError(f"categorical_fisher_operator: `weights` must have the logits' shape "
                         f"without the last axis, {logits.shape[:-1]}, got {weights.shape}")
    transpose = jax.linear_transpose(jvp_fn, params)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)

    def fvp(v: PyTree) -> PyTree:
        u = jvp_fn(v).astype(jnp.float32)
        hu = weights[..., None] * probs * (u - jnp.sum(probs * u, axis=-1, keepdims=True))
        (out,) = transpose(hu.astype(logits.dtype))
        return _add_scaled(out, damping, v) if damping else out

    return fvp, logits


def natural_gradient_step(
    grad: PyTree,
    fvp: Callable[[PyTree], PyTree],
    *,
    max_kl: float,
    cg_iters: int = 10,
    cg_tol: float = 1e-10,
    return_scale: bool = False,
) -> PyTree:
    """TRPO's full step: the natural gradient scaled to the trust-region boundary.

    x = F^{-1} g by conjugate gradient, d = sqrt(2 delta / x^T F x) x, so that
    0.5 d^T F d = delta (Schulman et al. 2015, https://arxiv.org/abs/1502.05477, appendix C;
    natural gradient: Kakade 2001, https://papers.nips.cc/paper/2073-a-natural-policy-gradient).
    Returns zeros if x^T F x is not positive.

    Args:
      grad: g, the gradient of the surrogate objective to maximise, a pytree.
      fvp: v -> F v (e.g. `functools.partial(fisher_vector_product, kl_fn, params)`).
      max_kl: delta, the trust-region radius in mean KL.
      cg_iters: conjugate gradient iterations.
      cg_tol: conjugate gradient tolerance on the squared residual.
      return_scale: also return sqrt(2 delta / x^T F x), the step size along x = F^{-1} g
        (the natural-gradient "learning rate" of this step).

    Returns:
      d, a pytree shaped like `grad`; the expected improvement is g.d. With `return_scale`,
      (d, scale).
    """
    if not max_kl > 0:
        raise ValueError(f"natural_gradient_step: `max_kl` must be > 0, got {max_kl}")
    direction = conjugate_gradient(fvp, grad, iters=cg_iters, tol=cg_tol)
    curvature = _vdot(direction, fvp(direction))
    safe = jnp.where(curvature > 0, curvature, 1.0)
    scale = jnp.where(curvature > 0, jnp.sqrt(2.0 * max_kl / safe), 0.0)
    step = jax.tree.map(lambda x: (scale * x).astype(x.dtype), direction)
    return (step, scale) if return_scale else step


class LineSearchResult(NamedTuple):
    """Outcome of `backtracking_line_search`."""

    params: PyTree  # accepted parameters, or the input parameters if nothing was accepted
    accepted: jax.Array  # bool scalar
    step_fraction: jax.Array  # beta^k of the accepted candidate (0 if none)
    improvement: jax.Array  # objective(new) - objective(params) (0 if none)
    constraint: jax.Array  # constraint(new) (constraint(params) if none)


def backtracking_line_search(
    objective_fn: Callable[[PyTree], jax.Array],
    constraint_fn: Callable[[PyTree], jax.Array],
    params: PyTree,
    step: PyTree,
    *,
    max_kl: float,
    expected_improvement,
    backtrack_ratio: float = 0.5,
    max_backtracks: int = 10,
    accept_ratio: float = 0.1,
) -> LineSearchResult:
    """TRPO's backtracking line search on the surrogate under the KL constraint.

    Tries theta + beta^k d for k = 0..max_backtracks-1 and accepts the first with
    improvement = f(theta + beta^k d) - f(theta) > 0,
    improvement / (beta^k expected_improvement) > accept_ratio and
    constraint(theta + beta^k d) <= max_kl (Schulman et al. 2015,
    https://arxiv.org/abs/1502.05477, appendix C).

    Args:
      objective_fn: params -> scalar surrogate objective to maximise.
      constraint_fn: params -> scalar mean KL from the old policy.
      params: theta, a pytree.
      step: d, the full step, a pytree shaped like `params`.
      max_kl: delta, the largest KL accepted.
      expected_improvement: scalar g.d, the first-order improvement of the full step.
      backtrack_ratio: beta in (0, 1).
      max_backtracks: number of candidates tried.
      accept_ratio: smallest accepted ratio of actual to expected improvement.

    Returns:
      A `LineSearchResult` (params, accepted, step_fraction, improvement, constraint).
    """
    fn = "backtracking_line_search"
    if not 0 < backtrack_ratio < 1:
        raise ValueError(f"{fn}: `backtrack_ratio` must be in (0, 1), got {backtrack_ratio}")
    if not isinstance(max_backtracks, int) or max_backtracks < 1:
        raise ValueError(f"{fn}: `max_backtracks` must be an int >= 1, got {max_backtracks!r}")
    base = objective_fn(params)
    expected_improvement = jnp.asarray(expected_improvement, jnp.float32)

    def evaluate(k):
        fraction = jnp.asarray(backtrack_ratio, jnp.float32) ** k
        candidate = _add_scaled(params, fraction, step)
        improvement = objective_fn(candidate) - base
        constraint = constraint_fn(candidate)
        ok = (
            (improvement > 0)
            & (improvement > accept_ratio * fraction * expected_improvement)
            & (constraint <= max_kl)
        )
        return ok, fraction, improvement, constraint

    def cond(state):
        k, accepted = state[:2]
        return (k < max_backtracks) & ~accepted

    def body(state):
        k = state[0]
        ok, fraction, improvement, constraint = evaluate(k)
        return jnp.where(ok, k, k + 1), ok, fraction, improvement, constraint

    first = evaluate(jnp.zeros((), jnp.int32))
    init = (jnp.where(first[0], 0, 1).astype(jnp.int32), *first)
    _, accepted, fraction, improvement, constraint = jax.lax.while_loop(cond, body, init)
    fraction = jnp.where(accepted, fraction, 0.0)
    new_params = _add_scaled(params, fraction, step)
    return LineSearchResult(
        params=new_params,
        accepted=accepted,
        step_fraction=fraction,
        improvement=jnp.where(accepted, improvement, 0.0),
        constraint=jnp.where(accepted, constraint, constraint_fn(params)),
    )
