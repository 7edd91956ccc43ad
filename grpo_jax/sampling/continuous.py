"""Continuous batching: R rows sampled in S < R slots, a slot taking the next row as soon as
its row ends, so a batch does not wait for its longest row.

Before the loop, the prompts are prefilled once per prompt group (`SamplingConfig.
prompt_group`: the G completions of one prompt share its keys and values), all groups in one
batched call. One `lax.while_loop` (`run_slots`) over steps; each step first refills every
free slot with the next pending row (its group's prompt keys and values copied into the
slot's KV cache rows, its first token chosen from the group's last prefill logits: a refill
computes nothing), then decodes one token for every slot that holds a row. Each
slot writes at its own cache column (`models.KVCache` with a per-row index) and each row's
outputs go to its own row of the [R, N] buffers. Row r chooses its column t with the key
fold_in(fold_in(key, r), t), as the static decode core does (`sampling.decode`), so a row's
tokens depend on its key, its index and the parameters, not on which slot or when it ran:
with 1, 3 or R slots the samples are the same (to the float rounding of different batch
shapes; tests/test_sampling.py).

Not here (yet): budget forcing, pauses (episodes) and cache phases (each slot holds P + N
columns); the static core does those.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from grpo_jax.models.transformer import KVCache, default_positions
from grpo_jax.sampling.choice import argmax, filter_and_sample, logp_at, row_keys
from grpo_jax.sampling.config import SamplingConfig


@flax.struct.dataclass
class SlotState:
    """The loop's carry.

    Attributes:
      cache: KVCache of S rows of P + N columns, with a per-row index (each slot's next
        column).
      row: [S] int32, the row a slot holds (R: none yet).
      t: [S] int32, the columns its row has written.
      position: [S] int32, the rotary position of the token to feed next.
      last_token: [S] int32, the token to feed next.
      active: [S] bool, the slot holds a row that has not ended.
      next_row: [] int32, the next row to start.
      tokens, logp, generated: [R, N] outputs by row (pad_id, 0, False where none).
    """

    cache: KVCache
    row: jax.Array
    t: jax.Array
    position: jax.Array
    last_token: jax.Array
    active: jax.Array
    next_row: jax.Array
    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array


def _choose(logits, key, rows, t, sampling: SamplingConfig):
    """(token, logp) [S] for logits [S, V]: row r's column t with fold_in(fold_in(key, r), t)
    (greedy: the argmax, its log-prob under the temperature-scaled distribution)."""
    scaled = logits if sampling.greedy else logits / sampling.temperature
    if sampling.greedy:
        token = argmax(scaled)
        return token, logp_at(scaled, token)
    return filter_and_sample(scaled, row_keys(key, rows, t), top_k=sampling.top_k,
                             top_p=sampling.top_p)


def _record(s: SlotState, token, logp, writing, sampling: SamplingConfig) -> SlotState:
    """Writes `token` / `logp` [S] at (row, t) for the slots `writing`; a row ends at EOS or
    at its last column."""
    rows = jnp.where(writing, s.row, s.tokens.shape[0])  # out of range: dropped
    eos = (jnp.any(token[:, None] == jnp.asarray(sampling.eos_ids, jnp.int32)[None], -1)
           if sampling.eos_ids else jnp.zeros(token.shape, bool))
    ended = eos | (s.t + 1 >= s.tokens.shape[1])
    return s.replace(
        tokens=s.tokens.at[rows, s.t].set(token, mode="drop"),
        logp=s.logp.at[rows, s.t].set(logp, mode="drop"),
        generated=s.generated.at[rows, s.t].set(True, mode="drop"),
        t=s.t + writing, last_token=jnp.where(writing, token, s.last_token),
        active=jnp.where(writing, ~ended, s.active))


@flax.struct.dataclass
class Prefilled:
    """The prompts prefilled once per prompt group: what a refill copies into a slot.

    Attributes:
      cache: KVCache of the R / G group prompts, P columns each.
      logits: [R / G, V] float32, the next-token logits after each group's prompt.
      positions: [R / G] int32, the rotary position of each group's first new token.
    """

    cache: KVCache
    logits: jax.Array
    positions: jax.Array


def _prefill_groups(model, prompts, prompt_mask, group: int) -> Prefilled:
    """One batched prefill of each group's prompt (rows group*G .. group*G + G - 1 share
    it)."""
    prompts, prompt_mask = prompts[::group], prompt_mask[::group]
    cache = model.init_cache(prompts.shape[0], prompts.shape[1])
    hidden, cache = model.decode(prompts, default_positions(prompt_mask), prompt_mask, cache)
    return Prefilled(cache=cache, logits=model.logits(hidden[:, -1]),
                     positions=prompt_mask.sum(-1).astype(jnp.int32))


def _refill(model, s: SlotState, prefilled: Prefilled, total: int, group: int, key,
            sampling: SamplingConfig):
    """Every free slot, in order, takes the next pending row: its group's prompt keys and
    values copied into the slot's cache rows (the slot's later columns marked invalid), its
    first token chosen from the group's prefill logits."""
    kv_heads = model.config.num_kv_heads
    prompt_len = prefilled.cache.key_valid.shape[1]
    width = s.cache.key_valid.shape[1]

    def fill(slot, s: SlotState) -> SlotState:
        row = s.next_row
        g = row // group
        copy = lambda big, small, shape: jax.lax.dynamic_update_slice(
            big, jax.lax.dynamic_slice(small, (g * kv_heads, 0, 0), shape).astype(big.dtype),
            (slot * kv_heads, 0, 0))
        head_dim = model.config.head_dim
        valid = jax.lax.dynamic_slice(prefilled.cache.key_valid, (g, 0), (1, prompt_len))
        cache = s.cache
        cache = cache.replace(
            keys=tuple(copy(big, small, (kv_heads, head_dim, prompt_len))
                       for big, small in zip(cache.keys, prefilled.cache.keys)),
            values=tuple(copy(big, small, (kv_heads, prompt_len, head_dim))
                         for big, small in zip(cache.values, prefilled.cache.values)),
            key_valid=jax.lax.dynamic_update_slice(
                cache.key_valid,
                jnp.concatenate([valid, jnp.zeros((1, width - prompt_len), bool)], 1),
                (slot, 0)),
            index=cache.index.at[slot].set(prompt_len))
        s = s.replace(cache=cache, row=s.row.at[slot].set(row), t=s.t.at[slot].set(0),
                      position=s.position.at[slot].set(prefilled.positions[g]),
                      next_row=row + 1)
        logits = jax.lax.dynamic_slice_in_dim(prefilled.logits, g, 1)
        token, logp = _choose(logits, key, row[None], jnp.zeros((1,), jnp.int32), sampling)
        one = jnp.arange(s.row.shape[0]) == slot
        return _record(s, jnp.where(one, token[0], 0), jnp.where(one, logp[0], 0.0), one,
                       sampling)

    def maybe_fill(slot, s: SlotState) -> SlotState:
        free = ~s.active[slot] & (s.next_row < total)
        return jax.lax.cond(free, lambda s: fill(slot, s), lambda s: s, s)

    # most steps free no slot: then the slots are not visited at all
    return jax.lax.cond(jnp.any(~s.active) & (s.next_row < total),
                        lambda s: jax.lax.fori_loop(0, s.row.shape[0], maybe_fill, s),
                        lambda s: s, s)


def _decode(model, s: SlotState, key, sampling: SamplingConfig) -> SlotState:
    """One token for every slot that holds a row, each at its own cache column."""
    hidden, cache = model.decode(s.last_token[:, None], s.position[:, None], s.active[:, None],
                                 s.cache)
    cache = cache.replace(index=jnp.where(s.active, cache.index, s.cache.index))
    s = s.replace(cache=cache, position=s.position + s.active)
    token, logp = _choose(model.logits(hidden[:, 0]), key, s.row, s.t, sampling)
    return _record(s, token, logp, s.active, sampling)


def run_slots(model, prompts, prompt_mask, key, sampling: SamplingConfig, slots: int):
    """Samples sampling.max_new_tokens columns for each of R left-padded prompts in `slots`
    slots; returns (tokens, logp, generated) [R, N] by row.

    Args:
      model: the Transformer (weights from `decode.rollout_state`).
      prompts: [R, P] int32, left-padded; prompt_mask: [R, P] bool (rows in contiguous
        groups of sampling.prompt_group sharing one prompt).
      key: PRNG key (row r chooses column t with fold_in(fold_in(key, r), t)).
      sampling: SamplingConfig (no budget forcing).
      slots: S, 1 <= S <= R.
    """
    total, prompt_len = prompts.shape
    n = sampling.max_new_tokens
    cache = model.init_cache(slots, prompt_len + n)
    cache = cache.replace(index=jnp.full((slots,), prompt_len, jnp.int32))
    state = SlotState(
        cache=cache, row=jnp.full((slots,), total, jnp.int32),
        t=jnp.zeros((slots,), jnp.int32), position=jnp.zeros((slots,), jnp.int32),
        last_token=jnp.zeros((slots,), jnp.int32), active=jnp.zeros((slots,), bool),
        next_row=jnp.zeros((), jnp.int32),
        tokens=jnp.full((total, n), sampling.pad_id, jnp.int32),
        logp=jnp.zeros((total, n), jnp.float32), generated=jnp.zeros((total, n), bool))

    group = sampling.prompt_group
    prefilled = _prefill_groups(model, prompts, prompt_mask, group)

    def body(s):
        s = _refill(model, s, prefilled, total, group, key, sampling)
        return _decode(model, s, key, sampling)

    done = jax.lax.while_loop(lambda s: jnp.any(s.active) | (s.next_row < total), body, state)
    return done.tokens, done.logp, done.generated
