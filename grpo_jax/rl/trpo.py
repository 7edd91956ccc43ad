"""TRPO for small language models: the natural-gradient step on group-normalised advantages.

One rollout batch gives one step (Schulman et al. 2015, https://arxiv.org/abs/1502.05477):
g = grad of the token-mean surrogate L(theta) = mean_t ratio_t A_t at theta_old; the
Fisher-vector product is the Hessian-vector product of the exact mean KL(pi_old || pi_theta)
over the vocabulary at the sampled completion positions, computed in its Gauss-Newton form
on the network linearised once per step (`losses.categorical_fisher_operator`); the full
step d = sqrt(2 delta / x^T F x) x with x = F^{-1} g by conjugate gradient; the
backtracking line search accepts the first theta + beta^k d that improves L and keeps the
true KL <= delta. The exact KL needs the [B, N, V] logits, so this is for small
vocabularies / models. The stage kind "trpo" (grpo_jax/stages/trpo.py) runs it in the
shared RL loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax.tree_utils as otu

from grpo_jax import losses
from grpo_jax.models import entropy_of, target_logp
from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.rl.update import logp_mismatch
from grpo_jax.training import Params, Policy, all_finite, keep_if


def completion_logits(policy: Policy, params: Params, tokens, attention_mask, prompt_len: int):
    """Logits predicting each completion token: [B, N, V] float32 (read after token t-1)."""
    model = policy.bind(params)
    logits = model(tokens, attention_mask=attention_mask)
    return logits[:, prompt_len - 1:-1]


def trpo_objectives(policy: Policy, old_params: Params, batch: RolloutBatch, *,
                    prompt_len: int, old_logits=None):
    """(surrogate(params), mean_kl(params)) closures at fixed old params and batch.

    surrogate = sum_t m_t exp(logp_t - old_logp_t) A_t / sum_t m_t;
    mean_kl = sum_t m_t KL(pi_old(.|t) || pi(.|t)) / sum_t m_t (exact over the vocabulary).
    `old_logits`: the old params' completion logits if already computed (else computed here).
    """
    tokens, attn, mask = batch.tokens, batch.attention_mask, batch.loss_mask
    targets = tokens[:, prompt_len:]
    num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    if old_logits is None:
        old_logits = completion_logits(policy, old_params, tokens, attn, prompt_len)
    old_logits = jax.lax.stop_gradient(old_logits)
    old_logp = target_logp(jax.nn.log_softmax(old_logits), targets)
    advantages = batch.advantages

    def surrogate(params):
        logits = completion_logits(policy, params, tokens, attn, prompt_len)
        logp = target_logp(jax.nn.log_softmax(logits), targets)
        ratio = jnp.exp(logp - old_logp)
        return jnp.sum(jnp.where(mask, ratio * advantages, 0.0)) / num_tokens

    def mean_kl(params):
        logits = completion_logits(policy, params, tokens, attn, prompt_len)
        kl = losses.full_kl(old_logits, logits)
        return jnp.sum(jnp.where(mask, kl, 0.0)) / num_tokens

    return surrogate, mean_kl


def fisher_rows(batch_size: int, fraction: float):
    """The rows the Fisher-vector products use: all (None) at fraction 1, else
    max(1, round(fraction * batch_size)) rows evenly spaced over the batch (so over its
    prompt groups). The Fisher only sets the metric of the step, so a subsample of the batch
    serves: 10% of the data brings the products to about a gradient's cost (Schulman 2016,
    "Optimizing Expectations", PhD thesis, UC Berkeley, EECS-2016-217, on TRPO)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fisher_fraction must be in (0, 1], got {fraction}")
    count = max(1, round(fraction * batch_size))
    if count >= batch_size:
        return None
    return np.round(np.linspace(0, batch_size - 1, count)).astype(np.int32)


def make_trpo_step(policy: Policy, *, prompt_len: int, max_kl: float, damping: float = 0.1,
                   cg_iters: int = 10, backtrack_ratio: float = 0.5, max_backtracks: int = 10,
                   accept_ratio: float = 0.1, fisher_fraction: float = 1.0):
    """jit(params, batch) -> (params, metrics): one TRPO step on a rollout batch.

    The Fisher-vector products use the `fisher_rows(B, fisher_fraction)` rows of the batch
    (all at 1.0); the gradient, the line search and its KL constraint use every row.

    batch: a `RolloutBatch` with per-token advantages [B, N]; the metrics include
    logp_diff_max / logp_diff_mean against its behaviour (sampler) log-probs.
    metrics: surrogate_gain, expected_gain, kl_step (the accepted step's true mean
    KL(pi_old || pi_new)), accepted, step_fraction, grad_norm, entropy (of pi_old, token
    mean), learning_rate (step_fraction * sqrt(2 delta / x^T F x): the accepted step size
    along the natural gradient x = F^{-1} g), and "skipped" (a non-finite step is not
    applied: the parameters stay).
    """

    @jax.jit
    def step(params, batch):
        mask = batch.loss_mask
        num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
        rows = fisher_rows(mask.shape[0], fisher_fraction)
        if rows is None:
            tokens, attn, weights = batch.tokens, batch.attention_mask, mask
        else:
            tokens, attn, weights = batch.tokens[rows], batch.attention_mask[rows], mask[rows]
        weights = weights.astype(jnp.float32)
        fvp, logits = losses.categorical_fisher_operator(
            lambda p: completion_logits(policy, p, tokens, attn, prompt_len),
            params, weights / jnp.maximum(jnp.sum(weights), 1.0), damping=damping)
        old_logits = logits if rows is None else completion_logits(
            policy, params, batch.tokens, batch.attention_mask, prompt_len)
        surrogate, mean_kl = trpo_objectives(policy, params, batch, prompt_len=prompt_len,
                                             old_logits=old_logits)
        grad = jax.grad(surrogate)(params)
        full_step, scale = losses.natural_gradient_step(grad, fvp, max_kl=max_kl,
                                                        cg_iters=cg_iters, return_scale=True)
        expected = otu.tree_vdot(grad, full_step)
        result = losses.backtracking_line_search(
            surrogate, mean_kl, params, full_step, max_kl=max_kl,
            expected_improvement=expected, backtrack_ratio=backtrack_ratio,
            max_backtracks=max_backtracks, accept_ratio=accept_ratio)
        old_logp_all = jax.nn.log_softmax(old_logits)
        entropy = entropy_of(old_logp_all)
        metrics = {"surrogate_gain": result.improvement, "expected_gain": expected,
                   "kl_step": result.constraint,
                   "accepted": result.accepted.astype(jnp.float32),
                   "step_fraction": result.step_fraction,
                   "grad_norm": jnp.sqrt(otu.tree_vdot(grad, grad)),
                   "entropy": jnp.sum(jnp.where(mask, entropy, 0.0)) / num_tokens,
                   "learning_rate": result.step_fraction * scale}
        old_logp = target_logp(old_logp_all, batch.tokens[:, prompt_len:])
        metrics.update(logp_mismatch(old_logp, batch.behaviour_logp, mask))
        ok = all_finite(result.params) & jnp.isfinite(result.improvement) & all_finite(grad)
        metrics.update({"skipped": (~ok).astype(jnp.float32),
                        "nonfinite_grad": (~all_finite(grad)).astype(jnp.float32),
                        "nonfinite_update": (~all_finite(result.params)).astype(jnp.float32)})
        return keep_if(ok, result.params, params), metrics

    return step
