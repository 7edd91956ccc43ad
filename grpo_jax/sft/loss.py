"""Next-token (cross-entropy) loss over a loss mask, normalised by global token counts."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import optax

from grpo_jax import losses
from grpo_jax.models import logprobs
from grpo_jax.sft.data import TokenBatch
from grpo_jax.training import Params, Policy, jit_update, optimizer_step


def supervised_loss(params: Params, batch: TokenBatch, *, policy: Policy, num_tokens):
    """Token-mean negative log-likelihood of the masked tokens, and its metrics."""
    model = policy.bind(params)
    logp = logprobs(model, batch.tokens, batch.attention_mask,
                    chunk_size=policy.logprob_chunk_size, segment_ids=batch.segment_ids,
                    positions=batch.positions, chunk_rows=policy.logprob_chunk_rows)["logp"]
    nll = -logp
    loss = losses.aggregate(nll, batch.loss_mask, mode="token-mean", num_tokens=num_tokens)
    return loss, {"loss": loss}


def make_supervised_step(policy: Policy, optimizer: optax.GradientTransformation, *,
                         micro_batches: int = 1):
    """jit(params, opt_state, batch) -> (params, opt_state, metrics); a non-finite loss,
    gradient or update is not applied (metrics["skipped"])."""

    def step(params, opt_state, batch):
        num_tokens = jnp.maximum(jnp.sum(batch.loss_mask.astype(jnp.float32)), 1.0)
        loss_fn = functools.partial(supervised_loss, policy=policy, num_tokens=num_tokens)
        return optimizer_step(loss_fn, optimizer, params, opt_state, batch,
                              micro_batches=micro_batches, streams=policy.batch_streams)

    return jit_update(step)
