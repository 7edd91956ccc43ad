"""Reduction of per-token losses to a scalar, exact under micro-batching."""

from __future__ import annotations

import jax.numpy as jnp

from grpo_jax.losses import _checks

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(per_token, mask, *, mode: str, num_tokens=None, num_sequences=None, max_len=None):
    """Reduce a [B, T] per-token loss to a scalar under one of four normalisations.

    With m the mask, n_i = sum_t m_it, N_tok the valid-token count and N_seq the sequence
    count of the whole batch:
      token-mean:              sum_it m_it x_it / N_tok                 (DAPO: Yu et al. 2025,
                               https://arxiv.org/abs/2503.14476)
      seq-mean-token-mean:     sum_i (sum_t m_it x_it / n_i) / N_seq    (GRPO: Shao et al. 2024,
                               https://arxiv.org/abs/2402.03300)
      seq-mean-token-sum:      sum_i sum_t m_it x_it / N_seq
      seq-mean-token-sum-norm: sum_i sum_t m_it x_it / (max_len N_seq)  (Dr. GRPO: Liu et al.
                               2025, https://arxiv.org/abs/2503.20783)
    Each is a sum of per-sequence terms over a global constant, so summing this function
    over micro-batches called with the full batch's `num_tokens` / `num_sequences` (and one
    `max_len`) gives the full-batch value and gradient exactly. Masked entries are selected
    away (never multiplied), so NaN/inf there cannot leak; fully masked rows contribute 0.

    Args:
      per_token: [B, T] per-token values.
      mask: [B, T] bool, True on valid tokens.
      mode: one of the four modes above.
      num_tokens: global N_tok; default the valid tokens in `mask` (at least 1).
      num_sequences: global N_seq; default the rows of `mask` with a valid token (at least 1).
      max_len: the constant length of seq-mean-token-sum-norm; default T.

    Returns:
      Scalar.
    """
    fn = "aggregate"
    _checks.check_choice(fn, "mode", mode, MODES)
    _checks.check_rank(fn, 2, per_token=per_token)
    mask = _checks.check_mask(fn, mask, per_token, "per_token")
    values = jnp.where(mask, _checks.as_float(per_token), 0.0)
    if mode == "token-mean":
        if num_tokens is None:
            num_tokens = jnp.sum(mask)
        return jnp.sum(values) / jnp.maximum(num_tokens, 1).astype(values.dtype)
    if num_sequences is None:
        num_sequences = jnp.sum(jnp.any(mask, axis=-1))
    num_sequences = jnp.maximum(num_sequences, 1).astype(values.dtype)
    seq_sums = jnp.sum(values, axis=-1)
    if mode == "seq-mean-token-mean":
        seq_lengths = jnp.maximum(jnp.sum(mask, axis=-1), 1).astype(values.dtype)
        return jnp.sum(seq_sums / seq_lengths) / num_sequences
    if mode == "seq-mean-token-sum":
        return jnp.sum(seq_sums) / num_sequences
    if max_len is None:
        max_len = per_token.shape[-1]
    return jnp.sum(seq_sums) / (jnp.asarray(max_len, values.dtype) * num_sequences)
