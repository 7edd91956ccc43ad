"""The policy update: clipped surrogate + KL to the reference, aggregated with global counts.

One jitted `train_step` per (minibatch shape, loss settings): a minibatch is split into
micro-batches whose gradients are summed; every normalisation uses the minibatch's global
token and sequence counts, so 1 or k micro-batches give the same update.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import losses
from grpo_jax.models import completion_logprobs
from grpo_jax.training import (Params, Policy, accumulate_gradients, apply_if_finite,
                               jit_update)


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Static settings of the policy loss (hashable: part of the compiled program)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    dual_clip: float | None = None
    ratio_level: str = "token"  # token | sequence (GSPO)
    beta: float = 0.0
    kl_kind: str = "k3"
    loss_agg: str = "seq-mean-token-mean"
    on_policy: bool = True  # old_logp == stop_gradient(logp): a single pass per rollout
    temperature: float = 1.0  # logits / temperature, as in the sampling distribution


def sequence_logp(policy: Policy, params: Params, tokens, attention_mask, prompt_len: int,
                  temperature: float = 1.0, return_entropy: bool = False,
                  prompt_group: int = 1):
    """Teacher-forced log-probs of the completion part [B, N] (and entropies).

    `prompt_group` G > 1: rows come in contiguous groups of G sharing one prompt (the G
    completions of GRPO), whose prompt is then run once (`models.completion_logprobs`).
    """
    out = completion_logprobs(policy.bind(params), tokens, attention_mask, prompt_len,
                              group_size=prompt_group, return_entropy=return_entropy,
                              temperature=temperature, chunk_size=policy.logprob_chunk_size)
    return out["logp"], out.get("entropy")


def prompt_group_for(rows: int, group_size: int, micro_batches: int = 1) -> int:
    """The prompt group an update over `rows` rows in `micro_batches` can share: G when a
    micro-batch holds whole groups, else 1 (nothing shared)."""
    return group_size if group_size > 1 and (rows // micro_batches) % group_size == 0 else 1


def policy_loss(params: Params, batch: dict, *, policy: Policy, settings: LossSettings,
                prompt_len: int, num_tokens, num_sequences, prompt_group: int = 1):
    """Scalar loss of one micro-batch (normalised by global counts) and additive metrics."""
    mask = batch["completion_mask"]
    logp, entropy = sequence_logp(policy, params, batch["tokens"], batch["attention_mask"],
                                  prompt_len, settings.temperature, return_entropy=True,
                                  prompt_group=prompt_group)
    old_logp = jax.lax.stop_gradient(logp) if settings.on_policy else batch["old_logp"]
    advantages = jnp.broadcast_to(batch["advantages"][:, None], logp.shape)
    per_token, clipped = losses.clipped_surrogate(
        logp, old_logp, advantages,
        epsilon=settings.epsilon,
        epsilon_high=settings.epsilon_high,
        dual_clip=settings.dual_clip,
        mask=mask,
        ratio_level=settings.ratio_level,
    )
    max_len = logp.shape[1]
    token_mean = functools.partial(losses.aggregate, mask=mask, mode="token-mean",
                                   num_tokens=num_tokens)
    metrics = {
        "pg_loss": losses.aggregate(per_token, mask, mode=settings.loss_agg,
                                    num_tokens=num_tokens, num_sequences=num_sequences,
                                    max_len=max_len),
        "clip_frac": token_mean(clipped.astype(jnp.float32)),
        "entropy": token_mean(jax.lax.stop_gradient(entropy)),
    }
    if "sample_logp" in batch:  # the sampler's log-probs of the same tokens
        metrics.update(logp_mismatch(jax.lax.stop_gradient(logp), batch["sample_logp"], mask,
                                     num_tokens=num_tokens))
    total = per_token
    if settings.beta != 0.0:
        kl = losses.kl_penalty(logp, batch["ref_logp"], kind=settings.kl_kind)
        total = per_token + settings.beta * kl
        metrics["kl_ref"] = token_mean(jax.lax.stop_gradient(kl))
    loss = losses.aggregate(total, mask, mode=settings.loss_agg, num_tokens=num_tokens,
                            num_sequences=num_sequences, max_len=max_len)
    metrics["loss"] = loss
    return loss, metrics


def make_train_step(policy: Policy, optimizer: optax.GradientTransformation,
                    settings: LossSettings, *, prompt_len: int, micro_batches: int,
                    group_size: int = 1):
    """jit(params, opt_state, batch) -> (params, opt_state, metrics).

    `group_size` G > 1 promises that the batch's rows come in contiguous groups of G sharing
    one prompt (`sampling.check_prompt_groups`); each micro-batch and row group then runs
    each prompt once, when it holds whole groups (`prompt_group_for`). A non-finite loss,
    gradient or update is not applied (`training.apply_if_finite`; the metrics' "skipped"
    flag says so)."""

    def train_step(params, opt_state, batch):
        mask = batch["completion_mask"]
        num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
        num_sequences = jnp.asarray(mask.shape[0], jnp.float32)
        group = prompt_group_for(mask.shape[0], group_size, micro_batches)
        loss_fn = functools.partial(policy_loss, policy=policy, settings=settings,
                                    prompt_len=prompt_len, num_tokens=num_tokens,
                                    num_sequences=num_sequences, prompt_group=group)
        loss, grads, metrics = accumulate_gradients(loss_fn, params, batch, micro_batches,
                                                      policy.batch_streams, row_unit=group)
        metrics["grad_norm"] = optax.global_norm(grads)
        params, opt_state, flags = apply_if_finite(optimizer, grads, opt_state, params,
                                                   loss=loss)
        return params, opt_state, {**metrics, **flags}

    return jit_update(train_step)


def make_logp_fn(policy: Policy, *, prompt_len: int, temperature: float = 1.0,
                 group_size: int = 1):
    """jit(params, tokens, attention_mask) -> completion log-probs [B, N] (no gradient);
    `group_size` as in `make_train_step`."""

    @jax.jit
    def fn(params, tokens, attention_mask):
        group = prompt_group_for(tokens.shape[0], group_size)
        logp, _ = sequence_logp(policy, params, tokens, attention_mask, prompt_len, temperature,
                                prompt_group=group)
        return logp

    return fn


def logp_mismatch(trainer_logp, sample_logp, mask, *, num_tokens=None) -> dict:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's.

    logp_diff_max = max |trainer - sampler| over valid tokens; logp_diff_mean = the sum over
    valid tokens / num_tokens (default: the valid-token count, so it is the mean). A
    train/inference mismatch (dtype, kernels, truncated sampling) shows up here; in float32
    on CPU expect about 1e-6.
    """
    mask = jnp.asarray(mask, bool)
    diff = jnp.where(mask, jnp.abs(jnp.asarray(trainer_logp, jnp.float32)
                                   - jnp.asarray(sample_logp, jnp.float32)), 0.0)
    if num_tokens is None:
        num_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    return {"logp_diff_max": jnp.max(diff), "logp_diff_mean": jnp.sum(diff) / num_tokens}


def build_batch(rollout, advantages=None) -> dict[str, Any]:
    """Host batch of one rollout: full sequences, masks, the sampler's log-probs and (if
    given) per-completion advantages."""
    tokens = np.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
    attention_mask = np.concatenate([rollout.prompt_mask, rollout.mask], axis=1)
    batch = {
        "tokens": tokens.astype(np.int32),
        "attention_mask": attention_mask,
        "completion_mask": np.asarray(rollout.mask),
        "sample_logp": np.asarray(rollout.sample_logp, np.float32),
    }
    if advantages is not None:
        batch["advantages"] = np.asarray(advantages, np.float32)
    return batch
