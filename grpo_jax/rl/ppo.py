"""PPO for language models with a critic: per-token rewards, GAE, the clipped updates.

The stage kind "ppo" (grpo_jax/stages/ppo.py) runs these pieces in the shared RL loop. Roles (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155; Ziegler et al. 2019,
https://arxiv.org/abs/1909.08593):

- policy: the run's parameters, trained with the clipped surrogate on per-token GAE advantages;
- value: a separate critic model, initialised from the policy's parameters plus a zero scalar
  head, trained with the clipped value loss (its own AdamW);
- reference: a frozen copy of the policy at the start of the stage;
- reward: the task's rule rewards and/or a learned reward model ("reward_model").

The per-token reward is r_t = -beta (log pi(y_t) - log pi_ref(y_t)) with the scalar reward
added on the last valid completion token; advantages come from `token_gae` and are whitened
over the valid tokens of the batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses
from grpo_jax.models import logprobs
from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.rl.packing import packed_completion_logprobs
from grpo_jax.rl.update import (batch_logp, batch_split, logp_mismatch, off_policy_weights,
                                 sequence_logp)
from grpo_jax.training import (FINITE_FLAGS, Params, Policy, jit_update, keep_if,
                               optimizer_step)

# ---------------------------------------------------------------------------------------
# Pure pieces


def last_valid_index(mask):
    """Index of the last True entry of each row of `mask` [B, T] -> [B] int32 (0 if none)."""
    mask = jnp.asarray(mask, bool)
    t = mask.shape[-1]
    return (t - 1 - jnp.argmax(mask[:, ::-1], axis=-1)).astype(jnp.int32) * jnp.any(mask, -1)


def ppo_token_rewards(scores, logp, ref_logp, mask, *, beta, token_rewards=None):
    """Per-token PPO rewards: KL penalty on every valid token, the score on the last one.

    r_t = -beta (log pi(y_t) - log pi_ref(y_t)) + 1[t = last valid] * score, and 0 on padding
    (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593, eq. 2; Ouyang et al. 2022,
    https://arxiv.org/abs/2203.02155, eq. 2). A row with no valid token gets no reward.
    With `token_rewards` (the part of each score earned at a token: an environment's turn
    rewards), r_t adds token_rewards_t on valid tokens and the last token gets the rest of
    the score, score - sum_t token_rewards_t: the same return, credited where it was earned.

    Args:
      scores: [B] scalar rewards of the completions.
      logp: [B, T] log-probs of the sampled tokens under the policy.
      ref_logp: [B, T] log-probs of the same tokens under the reference.
      mask: [B, T] bool, True on valid (generated, not padding) tokens.
      beta: KL coefficient, scalar (may be a traced array).
      token_rewards: [B, T] float32 or None.

    Returns:
      [B, T] float32 per-token rewards.
    """
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    mask = jnp.asarray(mask, bool)
    scores = jnp.asarray(scores, jnp.float32)
    if logp.ndim != 2 or logp.shape != ref_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"ppo_token_rewards: logp, ref_logp and mask must be [B, T] of one "
                         f"shape, got {logp.shape}, {ref_logp.shape}, {mask.shape}")
    if scores.shape != logp.shape[:1]:
        raise ValueError(f"ppo_token_rewards: scores must be [B]={logp.shape[:1]}, got "
                         f"{scores.shape}")
    penalty = jnp.where(mask, -jnp.asarray(beta, jnp.float32) * (logp - ref_logp), 0.0)
    positions = jnp.arange(logp.shape[1])[None, :]
    at_last = (positions == last_valid_index(mask)[:, None]) & jnp.any(mask, -1, keepdims=True)
    if token_rewards is not None:
        earned = jnp.where(mask, jnp.asarray(token_rewards, jnp.float32), 0.0)
        penalty = penalty + earned
        scores = scores - jnp.sum(earned, -1)
    return penalty + jnp.where(at_last, scores[:, None], 0.0)


def adaptive_kl_coef(beta: float, kl: float, *, target: float, horizon: float,
                     num_samples: int) -> float:
    """Adaptive KL controller: the next KL coefficient.

    e = clip(KL / KL_target - 1, -0.2, 0.2), beta <- beta (1 + e n / horizon)
    (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593, sec. 2.2).

    Args:
      beta: current coefficient.
      kl: measured mean KL(pi || pi_ref) per token of the last batch.
      target: KL_target.
      horizon: horizon in samples.
      num_samples: n, completions in the last batch.

    Returns:
      the new coefficient (a Python float).
    """
    error = float(np.clip(kl / target - 1.0, -0.2, 0.2))
    return float(beta * (1.0 + error * num_samples / horizon))


def completion_values(critic: Policy, critic_params: Params, tokens, attention_mask,
                      prompt_len: int):
    """V(s_t) before each completion token: the value head after token t-1, [B, N]."""
    out = logprobs(critic.bind(critic_params), tokens, attention_mask, return_values=True)
    return out["values"][:, prompt_len - 1:-1]


def make_prepare_fn(policy: Policy, critic: Policy, *, prompt_len: int, gamma: float,
                    lambda_: float, whiten_advantages: bool = True, use_reference: bool = True,
                    correction: str | None = None, is_cap: float = 2.0,
                    mis_range: tuple[float, float] = (0.5, 2.0)):
    """jit(params, ref_params, critic_params, batch, beta) -> (batch, metrics).

    The returned `RolloutBatch` carries old_logp, ref_logp, old_values, advantages and
    returns [B, N], computed from the per-token rewards (`ppo_token_rewards` of the batch's
    rewards); metrics: kl_ref (token mean of log pi - log pi_ref) and logp_diff_max /
    logp_diff_mean (`grpo_jax.rl.update.logp_mismatch` against the sampler's log-probs).
    With `correction` (stale rollouts, `rl.update.off_policy_weights`) old_logp is the
    proximal policy's and the batch gets the correction's is_weights and kept tokens
    ("none": old_logp is the sampler's own).
    """

    @jax.jit
    def prepare(params, ref_params, critic_params, batch: RolloutBatch, beta):
        tokens, attn, mask = batch.tokens, batch.attention_mask, batch.loss_mask
        old_logp, _ = sequence_logp(policy, params, tokens, attn, prompt_len)
        ref_logp = (sequence_logp(policy, ref_params, tokens, attn, prompt_len)[0]
                    if use_reference else old_logp)
        old_values = jnp.where(mask, completion_values(critic, critic_params, tokens, attn,
                                                       prompt_len), 0.0)
        rewards = ppo_token_rewards(batch.rewards, old_logp, ref_logp, mask, beta=beta,
                                    token_rewards=batch.token_rewards)
        advantages, returns = losses.token_gae(rewards, old_values, mask, gamma=gamma,
                                               lambda_=lambda_)
        if whiten_advantages:
            advantages = losses.whiten(advantages, mask)
        num_tokens = jnp.maximum(jnp.sum(mask), 1)
        kl = jnp.sum(jnp.where(mask, old_logp - ref_logp, 0.0)) / num_tokens
        batch = batch.replace(old_logp=old_logp, ref_logp=ref_logp, old_values=old_values,
                              advantages=advantages, returns=returns, token_rewards=None)
        metrics = {"kl_ref": kl, **logp_mismatch(old_logp, batch.behaviour_logp, mask)}
        if correction is not None:
            weights, kept, is_metrics = off_policy_weights(
                old_logp, batch.behaviour_logp, mask, correction=correction, cap=is_cap,
                low=mis_range[0], high=mis_range[1])
            metrics.update(is_metrics)
            batch = (batch.replace(old_logp=batch.behaviour_logp) if correction == "none"
                     else batch.replace(is_weights=weights, loss_mask=kept))
        return batch, metrics

    return prepare


def make_ppo_update(policy: Policy, critic: Policy, policy_optimizer, critic_optimizer, *,
                    prompt_len: int, epsilon: float, value_clip: float | None,
                    micro_batches: int = 1):
    """jit(params, opt_state, critic_params, critic_opt_state, batch) -> (..., metrics).

    Policy: token-mean clipped surrogate on per-token advantages; critic: token-mean clipped
    value loss; both normalised by the minibatch's global token count.
    """

    def policy_loss(params, batch: RolloutBatch, num_tokens):
        mask = batch.loss_mask
        logp, entropy = batch_logp(policy, params, batch, prompt_len)
        per_token, clipped = losses.clipped_surrogate(logp, batch.old_logp, batch.advantages,
                                                      epsilon=epsilon, mask=mask)
        if batch.is_weights is not None:  # an off-policy correction's per-token weights
            per_token = per_token * batch.is_weights
        mean = functools.partial(losses.aggregate, mask=mask, mode="token-mean",
                                 num_tokens=num_tokens)
        loss = mean(per_token)
        kl_step = mean(jax.lax.stop_gradient(batch.old_logp - logp))  # k1, old -> current
        return loss, {"pg_loss": loss, "clip_frac": mean(clipped.astype(jnp.float32)),
                      "entropy": mean(jax.lax.stop_gradient(entropy)), "kl_step": kl_step}

    def critic_loss(critic_params, batch: RolloutBatch, num_tokens):
        mask = batch.loss_mask
        if batch.packed is None:
            values = completion_values(critic, critic_params, batch.tokens,
                                       batch.attention_mask, prompt_len)
        else:  # the same values from the packed blocks
            values = packed_completion_logprobs(critic.bind(critic_params), batch.packed,
                                                return_values=True)["values"]
        per_token = losses.value_loss(values, batch.old_values, batch.returns, clip=value_clip)
        loss = losses.aggregate(per_token, mask, mode="token-mean", num_tokens=num_tokens)
        return loss, {"value_loss": loss}

    def update(params, opt_state, critic_params, critic_opt_state, batch):
        num_tokens = jnp.maximum(jnp.sum(batch.loss_mask.astype(jnp.float32)), 1.0)
        micro, policy_streams = batch_split(batch, micro_batches, policy.batch_streams)
        _, critic_streams = batch_split(batch, micro_batches, critic.batch_streams)
        new_params, new_opt_state, metrics = optimizer_step(
            functools.partial(policy_loss, num_tokens=num_tokens), policy_optimizer, params,
            opt_state, batch, micro_batches=micro, streams=policy_streams)
        new_critic, new_critic_opt, critic_metrics = optimizer_step(
            functools.partial(critic_loss, num_tokens=num_tokens), critic_optimizer,
            critic_params, critic_opt_state, batch, micro_batches=micro,
            streams=critic_streams, grad_norm_name="critic_grad_norm")
        # Policy and critic move together or not at all (a non-finite value of either).
        ok = (metrics["skipped"] + critic_metrics["skipped"]) == 0
        params, opt_state = keep_if(ok, (new_params, new_opt_state), (params, opt_state))
        critic_params, critic_opt_state = keep_if(ok, (new_critic, new_critic_opt),
                                                  (critic_params, critic_opt_state))
        flags = {k: jnp.maximum(metrics[k], critic_metrics[k]) for k in FINITE_FLAGS}
        return (params, opt_state, critic_params, critic_opt_state,
                {**metrics, **critic_metrics, **flags})

    return jit_update(update, num_state_args=4)
