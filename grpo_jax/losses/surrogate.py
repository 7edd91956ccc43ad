"""PPO-family clipped surrogate and clipped value losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks

_RATIO_LEVELS = ("token", "sequence")


def clipped_surrogate(
    logp,
    old_logp,
    advantages,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
    mask=None,
    ratio_level: str = "token",
):
    """Per-token PPO clipped surrogate loss, with clip-higher, dual-clip and GSPO options.

    loss_t = -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps_high) A_t), r_t = pi_theta / pi_old
    (PPO: Schulman et al. 2017, https://arxiv.org/abs/1707.06347; eps_high > eps is DAPO's
    clip-higher: Yu et al. 2025, https://arxiv.org/abs/2503.14476). With `dual_clip` = c > 1
    the loss of a negative advantage is also bounded, loss_t = min(loss_t, -c A_t)
    (Ye et al. 2020, https://arxiv.org/abs/1912.09729). With `ratio_level="sequence"`
    every token of a sequence uses the sequence ratio
    s = exp(mean_{valid t} (log pi_theta - log pi_old)) (GSPO: Zheng et al. 2025,
    https://arxiv.org/abs/2507.18071); aggregate those tokens with "seq-mean-token-mean" to
    get GSPO's per-sequence objective. `advantages` and `old_logp` are constants; the
    gradient is exactly zero where `clipped` is true.

    Args:
      logp: [B, T] log pi_theta of the sampled tokens.
      old_logp: [B, T] log pi_old of the same tokens (the sampling policy).
      advantages: [B, T] advantages (broadcast per-sequence advantages with [:, None]).
      epsilon: lower clip range, r >= 1 - epsilon.
      epsilon_high: upper clip range, r <= 1 + epsilon_high; defaults to `epsilon`.
      dual_clip: optional c > 1 bounding the loss of negative advantages by -c A.
      mask: [B, T] bool, valid tokens; required for `ratio_level="sequence"`; when given,
        `clipped` is False at masked positions.
      ratio_level: "token" (PPO) or "sequence" (GSPO).

    Returns:
      (loss [B, T], clipped [B, T] bool: where the clip binds for the advantage's sign,
      including the dual-clip bound). Masked positions are not zeroed in `loss`; reduce it
      with `aggregate`.
    """
    fn = "clipped_surrogate"
    _checks.check_choice(fn, "ratio_level", ratio_level, _RATIO_LEVELS)
    _checks.check_same_shape(fn, logp=logp, old_logp=old_logp, advantages=advantages)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    if not epsilon >= 0 or not epsilon_high >= 0:
        raise ValueError(
            f"{fn}: `epsilon`/`epsilon_high` must be >= 0, got {epsilon}, {epsilon_high}"
        )
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"{fn}: `dual_clip` must be > 1, got {dual_clip}")
    logp = _checks.as_float(logp)
    old_logp = jax.lax.stop_gradient(_checks.as_float(old_logp))
    advantages = jax.lax.stop_gradient(_checks.as_float(advantages))
    if mask is not None:
        mask = _checks.check_mask(fn, mask, logp, "logp")
    log_ratio = logp - old_logp
    if ratio_level == "sequence":
        if mask is None:
            raise ValueError(f"{fn}: ratio_level='sequence' needs `mask`")
        _checks.check_rank(fn, 2, logp=logp)
        count = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1)
        seq_log_ratio = jnp.sum(jnp.where(mask, log_ratio, 0.0), axis=-1, keepdims=True) / count
        log_ratio = jnp.broadcast_to(seq_log_ratio, logp.shape)
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - epsilon, 1.0 + epsilon_high
    clip_high = (advantages > 0) & (ratio > high)
    clip_low = (advantages < 0) & (ratio < low)
    # Where the clip binds the objective is the constant clipped value, so the gradient is 0.
    loss = jnp.where(
        clip_high, -high * advantages, jnp.where(clip_low, -low * advantages, -ratio * advantages)
    )
    clipped = clip_high | clip_low
    if dual_clip is not None:
        dual = (advantages < 0) & (ratio > dual_clip)
        loss = jnp.where(dual, -dual_clip * advantages, loss)
        clipped = clipped | dual
    if mask is not None:
        clipped = clipped & mask
    return loss, clipped


def cispo_surrogate(logp, old_logp, advantages, *, epsilon: float, epsilon_high: float,
                    mask=None):
    """Per-token CISPO loss: the clipped importance weight as a constant factor.

    loss_t = -sg(clip(r_t, 1 - eps, 1 + eps_high)) A_t log pi_theta(y_t), r_t = pi_theta /
    pi_old (CISPO, MiniMax 2025, https://arxiv.org/abs/2506.13585, eqs. 4-5). Unlike the
    clipped surrogate, a token whose ratio leaves the range keeps its gradient
    -w A grad log pi; only its weight w is bounded. At r = 1 the gradient equals the
    clipped surrogate's (-A grad log pi).

    Args:
      logp: [B, T] log pi_theta of the sampled tokens.
      old_logp: [B, T] log pi_old of the same tokens.
      advantages: [B, T] advantages.
      epsilon: lower range, w >= 1 - epsilon (1 or more: no lower bound).
      epsilon_high: upper range, w <= 1 + epsilon_high.
      mask: [B, T] bool, valid tokens; `clipped` is False elsewhere.

    Returns:
      (loss [B, T], clipped [B, T] bool: where the weight was bounded).
    """
    fn = "cispo_surrogate"
    _checks.check_same_shape(fn, logp=logp, old_logp=old_logp, advantages=advantages)
    if not epsilon >= 0 or not epsilon_high >= 0:
        raise ValueError(
            f"{fn}: `epsilon`/`epsilon_high` must be >= 0, got {epsilon}, {epsilon_high}"
        )
    logp = _checks.as_float(logp)
    old_logp = jax.lax.stop_gradient(_checks.as_float(old_logp))
    advantages = jax.lax.stop_gradient(_checks.as_float(advantages))
    ratio = jnp.exp(jax.lax.stop_gradient(logp) - old_logp)
    weight = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    clipped = weight != ratio
    if mask is not None:
        clipped = clipped & _checks.check_mask(fn, mask, logp, "logp")
    return -weight * advantages * logp, clipped


def value_loss(values, old_values, returns, *, clip: float | None):
    """Clipped squared-error value loss.

    loss_t = 0.5 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - R_t)^2), and
    0.5 (V_t - R_t)^2 when `clip` is None (PPO implementations: Engstrom et al. 2020,
    https://arxiv.org/abs/2005.12729; Schulman et al. 2017,
    https://arxiv.org/abs/1707.06347). `old_values` and `returns` are constants.

    Args:
      values: [B, T] current value predictions.
      old_values: [B, T] value predictions at sampling time.
      returns: [B, T] value targets.
      clip: c > 0, or None for the unclipped loss.

    Returns:
      [B, T] per-token loss.
    """
    fn = "value_loss"
    _checks.check_same_shape(fn, values=values, old_values=old_values, returns=returns)
    if clip is not None and not clip > 0:
        raise ValueError(f"{fn}: `clip` must be > 0 or None, got {clip}")
    values = _checks.as_float(values)
    old_values = jax.lax.stop_gradient(_checks.as_float(old_values))
    returns = jax.lax.stop_gradient(_checks.as_float(returns))
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped
    clipped_values = old_values + jnp.clip(values - old_values, -clip, clip)
    return 0.5 * jnp.maximum(unclipped, (clipped_values - returns) ** 2)
