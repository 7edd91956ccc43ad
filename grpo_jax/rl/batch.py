"""The rollout batch every RL learner reads, and the step record every RL loop logs.

`RolloutBatch` is one frozen pytree of [B, ...] arrays: the sequences, the two masks, the
sampler's log-probs, the rewards, the parameter version that sampled each row, and what
the learner adds before its update (advantages, old / reference log-probs, values). It is
built by one method, `rl.rollout.Rollout.to_batch`, from host numpy arrays (the host
source) or from traced arrays (the device source), and learners derive new batches with
`.replace(...)` instead of mutating a dict. Every row field's leading dimension is the row,
so the batch is split into micro-batches, row groups and minibatches by `jax.tree.map`
alone.

The loss mask is separate from the attention mask: a token may be attended to and still
carry no loss (a truncated completion under DAPO's overlong filter, or a tool's output).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
      version: [B] int32, the version of the parameters that sampled each row (the
        policy after `version` iterations of its stage), or [B, N] per completion token
        when a row's tokens were sampled by several versions (partial rollouts).
      advantages: [B, N] float32 per-token advantages (per-sequence estimators are
        broadcast over the completion), or None before the learner sets them.
      old_logp: [B, N] log-probs under the parameters that sampled the batch, recomputed by
        the trainer (off-policy passes and the KL-in-reward estimators), or None.
      ref_logp: [B, N] log-probs under the frozen reference, or None.
      old_values: [B, N] critic values at sampling time (PPO), or None.
      returns: [B, N] value targets (PPO), or None.
      is_weights: [B, N] per-token importance weights of an off-policy correction
        (`rl.update.off_policy_weights`) that multiply each token's objective, or None.
      correct: [B] bool, the completion counts as solved (`Rollout.correct`), or None.
      truncated: [B] bool, the completion hit the budget without an end token, or None.
      token_rewards: [B, N] float32, the part of `rewards` earned at each completion token
        (a stateful environment's turn rewards, weighted, on each turn's last token), or
        None: all of it at the end. PPO places it there (GAE then credits each turn); the
        GRPO family uses the total.
      minibatch_order: [I, B] int32, the rows of pass i of an iteration with several
        minibatches (minibatch m is the m-th contiguous block of row i; `minibatches`), or
        None (one minibatch: every pass is the batch in its order). Not a row field: it is
        dropped from the minibatches it describes.
      packed: the rows packed into fixed token blocks (`rl.packing.PackedRows`): the
        update's forward and backward passes run on them instead of the padded rows (same
        log-probs); None: padded. Not a row field (one micro-batch, one stream).
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
    correct: jax.Array | None = None
    truncated: jax.Array | None = None
    token_rewards: jax.Array | None = None
    minibatch_order: jax.Array | None = None
    packed: Any = None

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


def scan_minibatches(update, carry, batch: RolloutBatch, *, num_iterations: int,
                     num_minibatches: int):
    """Runs `update(carry, minibatch) -> (carry, metrics)` over one iteration's
    `num_iterations` passes of `num_minibatches` minibatches as one `lax.scan`, so the update
    is compiled once however many it runs (traceable: call it inside the jitted iteration).

    One minibatch: every pass is the whole batch. Several: pass i's minibatch m is the rows
    `batch.minibatch_order[i]` lists in its m-th contiguous block.

    Returns:
      (carry, metrics): the updates' metrics as one set: the maximum of `*_max`, else the
      mean; a single update's as they are.
    """
    order = batch.minibatch_order
    batch = batch.replace(minibatch_order=None)
    updates = num_iterations * num_minibatches
    if updates == 1:
        return update(carry, batch)
    if num_minibatches == 1:
        carry, metrics = jax.lax.scan(lambda c, _: update(c, batch), carry, None,
                                      length=updates)
    else:
        rows = jnp.reshape(jnp.asarray(order), (updates, batch.rows // num_minibatches))
        carry, metrics = jax.lax.scan(
            lambda c, idx: update(c, jax.tree.map(lambda x: x[idx], batch)), carry, rows)
    return carry, {k: jnp.max(v) if k.endswith("_max") else jnp.mean(v)
                   for k, v in metrics.items()}


def minibatch_order(rows: int, *, num_iterations: int, num_minibatches: int,
                    seed: tuple[int, ...]) -> np.ndarray | None:
    """[I, B] int32 row order of `num_iterations` passes in `num_minibatches` random row
    subsets, or None for one minibatch. Pass i's permutation is drawn from
    `np.random.default_rng([*seed, i])`; rows of a subset keep their batch order (each
    block sorted)."""
    if num_minibatches == 1:
        return None
    per = rows // num_minibatches
    order = []
    for it in range(num_iterations):
        perm = np.random.default_rng([*seed, it]).permutation(rows)
        order.append(np.concatenate([np.sort(perm[mb * per:(mb + 1) * per])
                                     for mb in range(num_minibatches)]))
    return np.asarray(order, np.int32)


def rollout_record(rewards, components: Mapping[str, jax.Array], correct, lengths, truncated,
                   *, group_size: int) -> dict[str, jax.Array]:
    """The rollout half of an RL step's metrics line, for the host and device sources alike.

    Args:
      rewards: [B] total rewards, in contiguous groups of `group_size`.
      components: reward name -> [B] unweighted component.
      correct: [B] bool, the completion counts as solved (pass@1).
      lengths: [B] completion lengths in tokens.
      truncated: [B] bool, hit max_new_tokens without an end token.
      group_size: G.

    Returns:
      reward_mean, reward_std, reward/<name>, pass@1, completion_length, completion_tokens
      (the batch's sampled tokens, for tokens per second), length_correct and
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
        "completion_tokens": jnp.sum(jnp.asarray(lengths, jnp.float32)),
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
