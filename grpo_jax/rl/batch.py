"""The rollout batch every RL learner reads, and the step record every RL loop logs.

`RolloutBatch` is one frozen pytree of [B, ...] arrays: the sequences, the two masks, the
sampler's log-probs, the rewards, the parameter version that sampled each row, and what
the learner adds before its update (advantages, old / reference log-probs, values). It is
built by one function, `rollout_batch`, from host numpy arrays (the host loop) or from
traced arrays (the fused loop), and learners derive new batches with `.replace(...)`
instead of mutating a dict. Every field's leading dimension is the row, so the batch is
split into micro-batches, row groups and minibatches by `jax.tree.map` alone.

The loss mask is separate from the attention mask: a token may be attended to and still
carry no loss (a truncated completion under DAPO's overlong filter, or a tool's output).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class RolloutBatch:
    """One batch of B sampled completions of N tokens after prompts of P tokens.

    Attributes:
      tokens: [B, P+N] int32, prompt (left-padded) then completion (padded after EOS).
      attention_mask: [B, P+N] bool, the tokens the model attends to.
      loss_mask: [B, N] bool, the completion tokens that carry loss, KL and metrics.
      behaviour_logp: [B, N] float32, log-probs of the sampled tokens under the sampling
        distribution (the sampler's own, recorded in the decode loop).
      rewards: [B] float32, the weighted total reward of each completion.
      version: [B] int32, the version of the parameters that sampled each row: the
        policy after `version` iterations of its stage.
      advantages: [B, N] float32 per-token advantages (per-sequence estimators are
        broadcast over the completion), or None before the learner sets them.
      old_logp: [B, N] log-probs under the parameters that sampled the batch, recomputed by
        the trainer (off-policy passes and the KL-in-reward estimators), or None.
      ref_logp: [B, N] log-probs under the frozen reference, or None.
      old_values: [B, N] critic values at sampling time (PPO), or None.
      returns: [B, N] value targets (PPO), or None.
      is_weights: [B, N] per-token importance weights of an off-policy correction
        (`rl.update.off_policy_weights`) that multiply each token's objective, or None.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    behaviour_logp: jax.Array
    rewards: jax.Array
    version: jax.Array
    advantages: jax.Array | None = None
    old_logp: jax.Array | None = None
    ref_logp: jax.Array | None = None
    old_values: jax.Array | None = None
    returns: jax.Array | None = None
    is_weights: jax.Array | None = None

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def prompt_len(self) -> int:
        return self.tokens.shape[1] - self.loss_mask.shape[1]

    def with_advantages(self, advantages) -> RolloutBatch:
        """The batch with advantages [B] (broadcast over the completion) or [B, N]."""
        xp = jnp if isinstance(advantages, jax.Array) else np
        advantages = xp.asarray(advantages, xp.float32)
        shape = self.loss_mask.shape
        if advantages.shape not in (shape[:1], shape):
            raise ValueError(f"advantages: expected [B]={shape[:1]} or [B, N]={shape}, got "
                             f"{advantages.shape}")
        if advantages.ndim == 1:
            advantages = xp.broadcast_to(advantages[:, None], shape)
        return self.replace(advantages=advantages)


def rollout_batch(prompt_tokens, prompt_mask, tokens, mask, behaviour_logp, rewards, *,
                  version, loss_mask=None) -> RolloutBatch:
    """The batch of one rollout; numpy in, numpy out (host), jax in, jax out (traced).

    Args:
      prompt_tokens, prompt_mask: [B, P] left-padded prompts and their mask.
      tokens, mask: [B, N] completion tokens and the generated-token mask (through EOS).
      behaviour_logp: [B, N] the sampler's log-probs of `tokens`.
      rewards: [B] total rewards.
      version: the parameter version that sampled the rows: an int or [B].
      loss_mask: [B, N] tokens that carry loss; defaults to `mask`. Must lie inside `mask`.

    Returns:
      a RolloutBatch without advantages.
    """
    xp = jnp if any(isinstance(x, jax.Array) for x in (prompt_tokens, tokens, mask, rewards)) \
        else np
    b, n = np.shape(tokens)
    for name, value, shape in (("prompt_mask", prompt_mask, np.shape(prompt_tokens)),
                               ("mask", mask, (b, n)), ("behaviour_logp", behaviour_logp, (b, n)),
                               ("rewards", rewards, (b,)),
                               ("loss_mask", mask if loss_mask is None else loss_mask, (b, n))):
        if tuple(np.shape(value)) != tuple(shape):
            raise ValueError(f"rollout_batch: {name} has shape {tuple(np.shape(value))}, "
                             f"expected {tuple(shape)}")
    mask = xp.asarray(mask, bool)
    loss_mask = mask if loss_mask is None else xp.asarray(loss_mask, bool) & mask
    return RolloutBatch(
        tokens=xp.concatenate([xp.asarray(prompt_tokens), xp.asarray(tokens)], 1
                              ).astype(xp.int32),
        attention_mask=xp.concatenate([xp.asarray(prompt_mask, bool), mask], 1),
        loss_mask=loss_mask,
        behaviour_logp=xp.asarray(behaviour_logp, xp.float32),
        rewards=xp.asarray(rewards, xp.float32),
        version=xp.broadcast_to(xp.asarray(version, xp.int32), (b,)),
    )


def rollout_record(rewards, components: Mapping[str, jax.Array], correct, lengths, truncated,
                   *, group_size: int) -> dict[str, jax.Array]:
    """The rollout half of an RL step's metrics line, for the host and fused loops alike.

    Args:
      rewards: [B] total rewards, in contiguous groups of `group_size`.
      components: reward name -> [B] unweighted component.
      correct: [B] bool, the completion counts as solved (pass@1).
      lengths: [B] completion lengths in tokens.
      truncated: [B] bool, hit max_new_tokens without an end token.
      group_size: G.

    Returns:
      reward_mean, reward_std, reward/<name>, pass@1, completion_length, length_correct and
      length_incorrect (the mean length of the solved and of the unsolved completions; NaN
      when there is none: Dr. GRPO's length bias shows in the second), truncated_frac and,
      for G > 1, zero_std_groups (the fraction of groups whose rewards are all equal: they
      carry no group-relative signal). Scalars (float32 arrays).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    record = {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        **{f"reward/{name}": jnp.mean(jnp.asarray(value, jnp.float32))
           for name, value in components.items()},
        "pass@1": jnp.mean(jnp.asarray(correct, jnp.float32)),
        "completion_length": jnp.mean(jnp.asarray(lengths, jnp.float32)),
        "truncated_frac": jnp.mean(jnp.asarray(truncated, jnp.float32)),
    }
    solved = jnp.asarray(correct, bool)
    lengths = jnp.asarray(lengths, jnp.float32)
    for name, rows in (("length_correct", solved), ("length_incorrect", ~solved)):
        count = jnp.sum(rows)
        record[name] = jnp.where(count > 0, jnp.sum(jnp.where(rows, lengths, 0.0))
                                 / jnp.maximum(count, 1), jnp.nan)
    if group_size > 1:
        groups = rewards.reshape(-1, group_size)
        record["zero_std_groups"] = jnp.mean(
            (jnp.max(groups, 1) == jnp.min(groups, 1)).astype(jnp.float32))
    return record
