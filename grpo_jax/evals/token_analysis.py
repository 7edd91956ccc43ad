"""What RL changed, token by token and parameter by parameter: the analysis utilities of the
"what is RL doing?" studies.

    out = token_divergence(policy, params, base_params, tokens, attention, prompt_len)
    out["kl"]            # [B, N] exact KL(pi || pi_base) at each completion position
    out["entropy"]       # [B, N] the policy's entropy there; out["base_entropy"]: the base's
    top_share(out["kl"], out["base_entropy"], mask, 0.2)  # KL share of the 20% highest-
                                                          # entropy tokens (of the base)
    update_sparsity(base_params, params, tol=1e-5)   # fraction of entries RL changed
    effective_rank(delta)                            # of one matrix's update
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses

__all__ = ["effective_rank", "token_divergence", "top_share", "update_sparsity"]


def _entropy(logits):
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.sum(jnp.exp(logp) * logp, -1)


def token_divergence(policy, params, base_params, tokens, attention, prompt_len: int, *,
                     chunk: int = 256) -> dict[str, np.ndarray]:
    """Per completion position of [B, P + N] rows (prompt flush right in its P columns):
    the exact KL(pi || pi_base) of the next-token distributions, and both policies'
    entropies, as numpy [B, N] (zeros where `attention` is off: mask them with the
    completion's own mask). Runs `chunk` rows at a time."""

    @jax.jit
    def fn(params, base_params, tokens, attention):
        logits = policy.bind(params)(tokens, attention_mask=attention)[:, prompt_len - 1:-1]
        base = policy.bind(base_params)(tokens, attention_mask=attention)[:, prompt_len - 1:-1]
        keep = attention[:, prompt_len:]
        return {"kl": jnp.where(keep, losses.full_kl(logits, base), 0.0),
                "entropy": jnp.where(keep, _entropy(logits), 0.0),
                "base_entropy": jnp.where(keep, _entropy(base), 0.0)}

    tokens, attention = np.asarray(tokens), np.asarray(attention, bool)
    parts = [fn(params, base_params, jnp.asarray(tokens[i:i + chunk]),
                jnp.asarray(attention[i:i + chunk])) for i in range(0, len(tokens), chunk)]
    return {name: np.concatenate([np.asarray(p[name]) for p in parts])
            for name in ("kl", "entropy", "base_entropy")}


def top_share(values, scores, mask, fraction: float = 0.2) -> float:
    """The share of sum(values) over the tokens of `mask` that falls on the `fraction` of
    them with the highest `scores` (at or above the scores' (1 - fraction) quantile, as
    `rl.update.entropy_tokens` selects); nan when the values sum to 0."""
    values, scores, mask = (np.asarray(x) for x in (values, scores, mask))
    mask = mask.astype(bool)
    if not mask.any():
        return float("nan")
    threshold = np.quantile(scores[mask], 1.0 - fraction)
    total = values[mask].sum()
    chosen = values[mask & (scores >= threshold)].sum()
    return float(chosen / total) if total else float("nan")


def update_sparsity(before, after, tol: float = 1e-5) -> dict[str, float]:
    """How much of a parameter tree an update changed: {"changed": the fraction of all
    entries with |after - before| > tol, "<path>": each leaf's fraction}."""
    flat_before = jax.tree_util.tree_flatten_with_path(before)[0]
    flat_after = jax.tree.leaves(after)
    if len(flat_before) != len(flat_after):
        raise ValueError(f"update_sparsity: trees of {len(flat_before)} and "
                         f"{len(flat_after)} leaves")
    out, changed, total = {}, 0, 0
    for (path, a), b in zip(flat_before, flat_after):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            raise ValueError(f"update_sparsity: {jax.tree_util.keystr(path)} has shapes "
                             f"{a.shape} and {b.shape}")
        moved = int(np.sum(np.abs(b - a) > tol))
        out[jax.tree_util.keystr(path)] = moved / max(a.size, 1)
        changed, total = changed + moved, total + a.size
    out["changed"] = changed / max(total, 1)
    return out


def effective_rank(matrix) -> float:
    """exp of the entropy of the normalised singular values of a 2-D matrix (Roy & Vetterli
    2007, "The effective rank: a measure of effective dimensionality"): n for n equal
    singular values, 1 for a rank-one matrix, 0 for the zero matrix."""
    matrix = np.asarray(matrix, np.float64)
    if matrix.ndim != 2:
        matrix = matrix.reshape(matrix.shape[0], -1)
    s = np.linalg.svd(matrix, compute_uv=False)
    if s.sum() == 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))
