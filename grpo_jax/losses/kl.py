"""KL divergence to a reference policy: per-token estimators and the exact value."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks

_KINDS = ("k1", "k2", "k3")


def kl_penalty(logp, ref_logp, *, kind: str = "k3"):
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    With d = log pi_ref - log pi_theta: k1 = -d, k2 = d^2 / 2,
    k3 = exp(d) - 1 - d = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1, written expm1(d) - d
    and clamped at 0 so rounding never makes it negative (Schulman 2020,
    http://joschu.net/blog/kl-approx.html; k3 is GRPO's penalty: Shao et al. 2024,
    https://arxiv.org/abs/2402.03300). k1 and k3 are unbiased: E_pi[k] = KL(pi || ref).

    As a loss term (differentiated through logp, the sampled tokens held fixed) their
    gradients are not those of their expectations (each line follows from
    E_pi[grad log pi] = 0):
      grad k1 = grad log pi:                  E_pi = 0 (no gradient in expectation);
      grad k2 = (log pi - log ref) grad log pi: E_pi = grad KL(pi || ref);
      grad k3 = (1 - ref / pi) grad log pi:     E_pi = -E_ref[grad log pi] = grad KL(ref || pi).
    So GRPO's k3 in the loss pulls towards the reference in the forward direction, k2 in the
    reverse one, and k1 belongs in the reward (where its value, not its gradient, acts), not
    in the loss (`tests/test_losses_surrogate_kl.py` checks the three exactly).

    Args:
      logp: [..., T] log pi_theta of the sampled tokens.
      ref_logp: [..., T] log pi_ref of the same tokens.
      kind: "k1", "k2" or "k3".

    Returns:
      [..., T] per-token estimates.
    """
    fn = "kl_penalty"
    _checks.check_choice(fn, "kind", kind, _KINDS)
    _checks.check_same_shape(fn, logp=logp, ref_logp=ref_logp)
    logp = _checks.as_float(logp)
    ref_logp = _checks.as_float(ref_logp)
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    log_ratio = ref_logp - logp
    return jnp.maximum(jnp.expm1(log_ratio) - log_ratio, 0.0)


def full_kl(logits, ref_logits):
    """Exact per-position KL(pi || pi_ref) summed over the vocabulary.

    KL_t = sum_v pi(v) (log pi(v) - log pi_ref(v)), pi = softmax(logits) (Kullback &
    Leibler 1951, https://doi.org/10.1214/aoms/1177729694). Vocabulary entries with
    pi(v) = 0 contribute 0.

    Args:
      logits: [..., T, V] policy logits.
      ref_logits: [..., T, V] reference logits.

    Returns:
      [..., T] KL per position.
    """
    fn = "full_kl"
    _checks.check_same_shape(fn, logits=logits, ref_logits=ref_logits)
    logp = jax.nn.log_softmax(_checks.as_float(logits), axis=-1)
    ref_logp = jax.nn.log_softmax(_checks.as_float(ref_logits), axis=-1)
    probs = jnp.exp(logp)
    support = probs > 0
    log_ratio = jnp.where(support, logp - ref_logp, 0.0)
    return jnp.sum(jnp.where(support, probs * log_ratio, 0.0), axis=-1)
