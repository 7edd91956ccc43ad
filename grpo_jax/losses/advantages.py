"""Baselines and advantage normalisation over groups of sampled completions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks

_SCALES = ("group", "batch", "none")


def _grouped(fn: str, rewards, group_size: int):
    _checks.check_rank(fn, 1, rewards=rewards)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{fn}: `group_size` must be a positive int, got {group_size!r}")
    n = rewards.shape[0]
    if n % group_size:
        raise ValueError(f"{fn}: `rewards` length {n} is not a multiple of group_size={group_size}")
    return _checks.as_float(rewards).reshape(n // group_size, group_size)


def _centred(grouped):
    """r - group mean, exactly 0 in groups whose rewards are all equal."""
    mean = jnp.mean(grouped, axis=-1, keepdims=True)
    all_equal = jnp.max(grouped, axis=-1, keepdims=True) == jnp.min(grouped, axis=-1, keepdims=True)
    return jnp.where(all_equal, 0.0, grouped - mean)


def _unbiased_std(x, axis):
    n = x.shape[axis] if axis is not None else x.size
    centred = x - jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.sum(centred**2, axis=axis, keepdims=True) / max(n - 1, 1)
    # sqrt has an infinite derivative at 0; keep it out of the gradient of equal groups.
    return jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)


def group_advantages(rewards, *, group_size: int, scale: str = "group", eps: float = 1e-6):
    """Group-relative advantages: reward minus its group's mean, optionally scaled by a std.

    A_i = (r_i - mean_g(r)) / (std + eps), with std the unbiased (ddof=1) standard deviation
    of the group (`scale="group"`, GRPO: Shao et al. 2024, https://arxiv.org/abs/2402.03300),
    of the whole batch (`scale="batch"`, group mean / batch std: Liu et al. 2025,
    https://arxiv.org/abs/2508.08221), or no scaling (`scale="none"`, Dr. GRPO: Liu et al.
    2025, https://arxiv.org/abs/2503.20783). A group whose rewards are all equal gets
    advantages of exactly 0.

    Args:
      rewards: [N * G] rewards, the G samples of each prompt contiguous.
      group_size: G, the number of samples per prompt.
      scale: "group", "batch" or "none".
      eps: added to the std before dividing.

    Returns:
      [N * G] advantages.
    """
    fn = "group_advantages"
    _checks.check_choice(fn, "scale", scale, _SCALES)
    grouped = _grouped(fn, rewards, group_size)
    centred = _centred(grouped)
    if scale != "none":
        std = _unbiased_std(grouped, axis=-1 if scale == "group" else None) + eps
        # Equal rewards with eps = 0 would give 0 / 0; their centred value is already 0.
        safe_std = jnp.where(std > 0, std, 1.0)
        centred = centred / safe_std
    return centred.reshape(-1)


def rloo_advantages(rewards, *, group_size: int):
    """REINFORCE leave-one-out advantages: each reward minus the mean of the others.

    A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean_g(r)) (Kool et al. 2019,
    https://openreview.net/forum?id=r1lgTGL5DE; Ahmadian et al. 2024,
    https://arxiv.org/abs/2402.14740). Exactly 0 in a group of equal rewards.

    Args:
      rewards: [N * G] rewards, the G samples of each prompt contiguous.
      group_size: G >= 2.

    Returns:
      [N * G] advantages.
    """
    fn = "rloo_advantages"
    grouped = _grouped(fn, rewards, group_size)
    if group_size < 2:
        raise ValueError(f"{fn}: `group_size` must be >= 2 to leave one out, got {group_size}")
    return (_centred(grouped) * (group_size / (group_size - 1))).reshape(-1)


def optimal_baseline(rewards, grad_sq_norms):
    """Variance-minimising constant baseline from per-sample score-function norms.

    b* = E[||grad log pi(a)||^2 R(a)] / E[||grad log pi(a)||^2], the b minimising
    E||grad log pi(a) (R(a) - b)||^2 (Greensmith, Bartlett & Baxter 2004,
    https://jmlr.org/papers/v5/greensmith04a.html; Weaver & Tao 2001,
    https://arxiv.org/abs/1301.2315). Falls back to the mean reward if every norm is 0.

    Args:
      rewards: [N] sampled rewards.
      grad_sq_norms: [N] squared norms of grad log pi for the same samples.

    Returns:
      Scalar baseline.
    """
    fn = "optimal_baseline"
    _checks.check_rank(fn, 1, rewards=rewards)
    _checks.check_same_shape(fn, rewards=rewards, grad_sq_norms=grad_sq_norms)
    rewards = _checks.as_float(rewards)
    weights = _checks.as_float(grad_sq_norms)
    total = jnp.sum(weights)
    safe_total = jnp.where(total > 0, total, 1.0)
    return jnp.where(total > 0, jnp.sum(weights * rewards) / safe_total, jnp.mean(rewards))


def whiten(x, mask=None, *, shift_mean: bool = True, eps: float = 1e-8, ddof: int = 0):
    """Normalise to zero mean and unit variance over the valid entries.

    y = (x - mean) / sqrt(var + eps), mean and var over entries where `mask` is true (var
    divides by count - ddof: 0 biased, 1 unbiased); with `shift_mean=False` the mean is
    added back, y = (x - mean)/sqrt(var + eps) + mean (advantage whitening as in PPO
    implementations: Engstrom et al. 2020, https://arxiv.org/abs/2005.12729). Masked entries
    are returned as 0.

    Args:
      x: array of any shape, e.g. [B, T].
      mask: optional bool array of the shape of `x`; None means every entry is valid.
      shift_mean: whether the output keeps zero mean (True) or the original mean (False).
      eps: added to the variance.
      ddof: delta degrees of freedom of the variance (0 or 1).

    Returns:
      Array of the shape of `x`.
    """
    fn = "whiten"
    x = _checks.as_float(x)
    mask = jnp.ones(x.shape, bool) if mask is None else _checks.check_mask(fn, mask, x, "x")
    count = jnp.maximum(jnp.sum(mask), 1)
    x_valid = jnp.where(mask, x, 0.0)
    mean = jnp.sum(x_valid) / count
    var = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0.0)) / jnp.maximum(count - ddof, 1)
    y = (x_valid - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        y = y + mean
    return jnp.where(mask, y, 0.0)


def reinforce_pp_advantages(scores, mask, *, token_penalty=None, eps: float = 1e-8):
    """REINFORCE++ advantages: per-token returns whitened over the valid tokens of the batch.

    r_t = -p_t on every valid token, plus the outcome score s on the last one;
    G_t = sum_{t' >= t} r_t' = s - sum_{t' >= t} p_t' (return-to-go, no discount);
    A_t = (G_t - mean) / sqrt(var + eps), mean and unbiased var over every valid token of
    the batch (global batch normalisation, no critic and no per-prompt baseline: Hu 2025,
    https://arxiv.org/abs/2501.03262; the normalisation of verl's
    `compute_reinforce_plus_plus_outcome_advantage`). The penalty p_t is beta times a
    per-token KL estimate to the reference (the KL is in the reward, not in the loss).

    Args:
      scores: [B] outcome rewards.
      mask: [B, T] bool, valid completion tokens (a prefix of each row).
      token_penalty: [B, T] per-token penalty p_t, or None for none.
      eps: added to the variance.

    Returns:
      [B, T] advantages, 0 on invalid tokens.
    """
    fn = "reinforce_pp_advantages"
    _checks.check_rank(fn, 1, scores=scores)
    scores = _checks.as_float(scores)
    mask = jnp.asarray(mask).astype(bool)
    _checks.check_rank(fn, 2, mask=mask)
    if mask.shape[0] != scores.shape[0]:
        raise ValueError(f"{fn}: `mask` has {mask.shape[0]} rows but `scores` has "
                         f"{scores.shape[0]}")
    penalty = jnp.zeros(mask.shape, jnp.float32) if token_penalty is None else \
        _checks.as_float(token_penalty)
    _checks.check_same_shape(fn, mask=mask, token_penalty=penalty)
    penalty = jnp.where(mask, penalty, 0.0)
    # sum over t' >= t of the penalty: a reverse cumulative sum along the completion.
    to_go = jnp.flip(jnp.cumsum(jnp.flip(penalty, -1), -1), -1)
    returns = jnp.where(mask, scores[:, None] - to_go, 0.0)
    return whiten(returns, mask, eps=eps, ddof=1)
