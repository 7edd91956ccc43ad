"""Temporal credit assignment: TD residuals, returns, k-step and GAE advantages.

Each kernel handles one trajectory (rank-1 arrays over time, rlax style); batch with
`jax.vmap`. `token_gae` is the batched, right-padded form used for language-model
completions. `discounts[t]` is gamma_t, the discount applied to what follows step t (0 at
an episode end).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks


def _trajectory(fn, rewards, values, discounts):
    _checks.check_rank(fn, 1, rewards=rewards, values=values, discounts=discounts)
    _checks.check_same_shape(fn, rewards=rewards, discounts=discounts)
    _checks.check_shape(fn, "values", values, (rewards.shape[0] + 1,))
    return _checks.as_float(rewards), _checks.as_float(values), _checks.as_float(discounts)


def td_residuals(rewards, values, discounts):
    """One-step temporal-difference residuals.

    delta_t = r_t + gamma_t V(s_{t+1}) - V(s_t) (Sutton 1988,
    https://doi.org/10.1007/BF00115009).

    Args:
      rewards: [T] rewards r_0..r_{T-1}.
      values: [T+1] values V(s_0)..V(s_T); the last entry bootstraps the tail.
      discounts: [T] discounts gamma_t.

    Returns:
      [T] residuals.
    """
    rewards, values, discounts = _trajectory("td_residuals", rewards, values, discounts)
    return rewards + discounts * values[1:] - values[:-1]


def _reverse_discounted_sum(x, decay, init):
    """y_t = x_t + decay_t y_{t+1}, y_T = init, by a reverse scan; returns y_0..y_{T-1}."""

    def step(carry, inputs):
        x_t, decay_t = inputs
        carry = x_t + decay_t * carry
        return carry, carry

    _, ys = jax.lax.scan(step, init, (x, decay), reverse=True)
    return ys


def discounted_returns(rewards, discounts, *, bootstrap_value=0.0):
    """Discounted returns by the backward recursion G_t = r_t + gamma_t G_{t+1}.

    G_t = sum_{l >= 0} (prod_{j < l} gamma_{t+j}) r_{t+l} + (prod_{j < T-t} gamma_{t+j}) V_T
    with G_T = `bootstrap_value` (Sutton & Barto 2018, ch. 3,
    http://incompleteideas.net/book/the-book-2nd.html).

    Args:
      rewards: [T] rewards.
      discounts: [T] discounts gamma_t.
      bootstrap_value: scalar G_T (e.g. V(s_T); 0 for a finished episode).

    Returns:
      [T] returns.
    """
    fn = "discounted_returns"
    _checks.check_rank(fn, 1, rewards=rewards, discounts=discounts)
    _checks.check_same_shape(fn, rewards=rewards, discounts=discounts)
    _checks.check_rank(fn, 0, bootstrap_value=bootstrap_value)
    rewards = _checks.as_float(rewards)
    discounts = _checks.as_float(discounts)
    init = _checks.as_float(bootstrap_value).astype(rewards.dtype)
    return _reverse_discounted_sum(rewards, discounts, init)


def gae(rewards, values, discounts, *, lambda_):
    """Generalized advantage estimation for one trajectory.

    A_t = delta_t + gamma_t lambda_t A_{t+1}, A_T = 0, i.e.
    A_t = sum_l (prod_{j < l} gamma_{t+j} lambda_{t+j}) delta_{t+l}, the exponentially
    weighted average (1 - lambda) sum_k lambda^{k-1} A^(k)_t of the k-step estimators
    (Schulman et al. 2016, https://arxiv.org/abs/1506.02438).

    Args:
      rewards: [T] rewards.
      values: [T+1] values V(s_0)..V(s_T); the last entry bootstraps the tail.
      discounts: [T] discounts gamma_t.
      lambda_: scalar or [T] trace parameter in [0, 1].

    Returns:
      [T] advantages.
    """
    rewards, values, discounts = _trajectory("gae", rewards, values, discounts)
    deltas = rewards + discounts * values[1:] - values[:-1]
    lambda_ = jnp.broadcast_to(_checks.as_float(lambda_).astype(deltas.dtype), deltas.shape)
    return _reverse_discounted_sum(deltas, discounts * lambda_, jnp.zeros((), deltas.dtype))


def kstep_advantages(rewards, values, discounts, *, k: int):
    """k-step advantage estimators of the GAE derivation, truncated at the horizon.

    A^(k)_t = sum_{l < k} (prod_{j < l} gamma_{t+j}) r_{t+l} + (prod_{j < k} gamma_{t+j})
    V(s_{t+k}) - V(s_t) = sum_{l < k} (prod_{j < l} gamma_{t+j}) delta_{t+l}; when t + k > T
    the sum stops at T and bootstraps with V(s_T) (Schulman et al. 2016, eqs. 11-15,
    https://arxiv.org/abs/1506.02438). k = 1 is the TD residual; k >= T the full return.

    Args:
      rewards: [T] rewards.
      values: [T+1] values V(s_0)..V(s_T).
      discounts: [T] discounts gamma_t.
      k: number of steps, a Python int >= 1.

    Returns:
      [T] advantages.
    """
    fn = "kstep_advantages"
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"{fn}: `k` must be a Python int >= 1, got {k!r}")
    rewards, values, discounts = _trajectory(fn, rewards, values, discounts)
    horizon = rewards.shape[0]
    deltas = rewards + discounts * values[1:] - values[:-1]
    padded_deltas = jnp.concatenate([deltas, jnp.zeros_like(deltas)])
    padded_discounts = jnp.concatenate([discounts, jnp.zeros_like(discounts)])

    def step(carry, offset):
        total, weight = carry  # weight_t = prod_{j < offset} gamma_{t+j}
        shifted_deltas = jax.lax.dynamic_slice(padded_deltas, (offset,), (horizon,))
        shifted_discounts = jax.lax.dynamic_slice(padded_discounts, (offset,), (horizon,))
        return (total + weight * shifted_deltas, weight * shifted_discounts), None

    init = (jnp.zeros_like(deltas), jnp.ones_like(deltas))
    (total, _), _ = jax.lax.scan(step, init, jnp.arange(min(k, horizon)))
    return total


def token_gae(rewards, values, mask, *, gamma, lambda_):
    """GAE over the valid tokens of completions, with V = 0 after the last one.

    delta_t = r_t + gamma V_{t'} - V_t and A_t = delta_t + gamma lambda A_{t'}, where t' is
    the next valid token after t (none after the last: V = A = 0 there), so padding
    contributes nothing; returns R_t = A_t + V_t are the value targets (Schulman et al.
    2016, https://arxiv.org/abs/1506.02438; token-level PPO for language models: Ouyang et
    al. 2022, https://arxiv.org/abs/2203.02155). Invalid tokens between valid ones (a tool's
    observation inside a multi-turn completion) are the environment's transition: they are
    skipped, not an end, so the policy's tokens before a call are credited with what
    follows it.

    Args:
      rewards: [B, T] per-token rewards (e.g. the outcome reward on the last valid token,
        minus a per-token KL penalty).
      values: [B, T] value estimates V_t for each token position.
      mask: [B, T] bool, True on valid tokens (anywhere in the row).
      gamma: discount per valid token, scalar.
      lambda_: trace parameter, scalar.

    Returns:
      (advantages [B, T], returns [B, T]), both 0 at invalid positions.
    """
    fn = "token_gae"
    _checks.check_rank(fn, 2, rewards=rewards)
    _checks.check_same_shape(fn, rewards=rewards, values=values)
    mask = _checks.check_mask(fn, mask, rewards, "rewards")
    # Valid tokens first, in order (a stable sort): the recursion runs over a valid prefix,
    # and its results go back to their positions.
    order = jnp.argsort(~mask, axis=1, stable=True)
    advantages, returns = _prefix_gae(*(jnp.take_along_axis(x, order, axis=1)
                                        for x in (rewards, values, mask)),
                                      gamma=gamma, lambda_=lambda_)
    inverse = jnp.argsort(order, axis=1)
    return (jnp.take_along_axis(advantages, inverse, axis=1),
            jnp.take_along_axis(returns, inverse, axis=1))


def _prefix_gae(rewards, values, mask, *, gamma, lambda_):
    """`token_gae` of rows whose valid tokens are a prefix."""
    valid = mask.astype(jnp.float32)
    rewards = jnp.where(mask, _checks.as_float(rewards), 0.0)
    values = jnp.where(mask, _checks.as_float(values), 0.0)
    next_valid = jnp.concatenate([valid[:, 1:], jnp.zeros_like(valid[:, :1])], axis=1)
    discounts = _checks.as_float(gamma) * next_valid
    bootstrapped = jnp.concatenate([values, jnp.zeros_like(values[:, :1])], axis=1)
    advantages = jax.vmap(lambda r, v, d: gae(r, v, d, lambda_=lambda_))(
        rewards, bootstrapped, discounts.astype(rewards.dtype)
    )
    advantages = jnp.where(mask, advantages, 0.0)
    return advantages, jnp.where(mask, advantages + values, 0.0)
