"""REINFORCE: the per-token score-function loss."""

from __future__ import annotations

import jax

from grpo_jax.losses import _checks


def policy_gradient(logp, advantages):
    """REINFORCE per-token loss, the negated score-function surrogate.

    loss_t = -sg(A_t) * log pi_theta(a_t | s_t), so that grad loss = -A grad log pi, the
    likelihood-ratio estimator of -grad J (Williams 1992,
    https://doi.org/10.1007/BF00992696; policy gradient theorem: Sutton et al. 2000,
    https://papers.nips.cc/paper/1713-policy-gradient-methods-for-reinforcement-learning-with-function-approximation
    ). Advantages are treated as constants.

    Args:
      logp: log pi_theta of the taken actions, any shape, e.g. [B, T].
      advantages: advantages, same shape as `logp` (broadcast a per-sequence [B] advantage
        to [B, T] at the call site with `advantages[:, None]`).

    Returns:
      Per-token loss, same shape as `logp`, float32 (or wider).
    """
    _checks.check_same_shape("policy_gradient", logp=logp, advantages=advantages)
    logp = _checks.as_float(logp)
    advantages = jax.lax.stop_gradient(_checks.as_float(advantages))
    return -advantages * logp
