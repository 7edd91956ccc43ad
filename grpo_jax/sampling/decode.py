"""The decode core: one prefill, then one `lax.while_loop` of cached decode steps.

Both samplers run it: `sampler.generate` (single-turn, the loop without pauses, one device
call) and `episodes.generate_episodes` (multi-turn, the loop plus a host hand-off).

Two names: a *column* is one of the N positions of a row's completion; a *slot* is one of
the S rows decoded at once by continuous batching (`SamplingConfig.slots`), which takes the
R rows in turn. A run writes one column per step for every row (`DecodeState`). A column
holds a token of the policy (`generated`: it carries the loss), a token the environment wrote
(`observation`), or nothing (a hole: a row waiting for the host). The tokens the policy did
not choose come from one queue per row: budget forcing fills it (the end-of-thinking
delimiter at the maximum, the continuation in place of a premature end; these are
`generated` and `forced`), the host fills it with the environment's answer
(`hand_off`; these are `observation`). One pause rule (`paused`) stops the loop for the
host: a row whose last policy tokens are `DecodeSpec.stop_ids` waits, and the loop stops
when one has waited `max_wait_tokens` steps, the columns run out, or no other row can go
on. A step (`_write`) is four pieces: token choice (`_choose`), forcing (`_unchosen`: the
queue's next token, or budget forcing's), feeding and pausing (`_roles`, `_pause`) and the
layout's writer (`_write_columns`).

The prompt is prefilled once per prompt group (`SamplingConfig.prompt_group`), the KV cache
grows in `SamplingConfig.cache_phases` phases (one `run` each), the weights are cast to the
compute dtype once (`rollout_state`), and on a mesh every row-major buffer keeps the
rollout layout (rows over data x fsdp; no collective in a decode step).

Continuous batching (`DecodeSpec.continuous`, `start_slots`) is the same loop over S < R
slots instead of the R rows: each step first gives every free slot (its row ended, or none
yet) the next pending row (its group's prompt keys and values copied into the slot's cache
rows, its first token chosen from the group's prefill logits: a refill computes nothing),
then decodes one token for every slot with a token to feed. Each slot writes at its own
cache column (`models.KVCache` with a per-row index) and its own completion column `t`,
into its row of the [R, N] outputs; a slot whose row waits for the host writes nothing (no
holes), so a row's columns do not depend on the other rows. Row r chooses its column t with
fold_in(fold_in(key, r), t) in both layouts, so its tokens depend on its key, index and the
parameters only: with 1, 3 or R slots the samples are the same (to the float rounding of
different batch shapes), and single-turn they equal the static layout's (episodes: the
static layout samples columns after the first with fold_in(key, 1) as its key, so its
samples differ from this layout's). The cache grows in
the same phases (`SamplingConfig.cache_phases`): a run stops when a slot's row reaches the
last column of the phase (`at_edge`) and `grow` widens every slot's cache, so early steps
attend over a short buffer; a row refilled later starts again at the prompt's end.

Features are static: a spec without stop_ids carries no pause fields in its state and does
no work for them in a step; one without budget forcing carries no forcing fields or queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.models.transformer import (KVCache, default_positions, first_of_groups,
                                         spread_to_groups)
from grpo_jax.sampling.choice import argmax, filter_and_sample, logp_at, row_keys
from grpo_jax.sampling.config import SamplingConfig, phase_ends


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Static settings of one decode run (hashable: a jit static argument).

    Attributes:
      sampling: token choice (greedy, temperature, top_k, top_p), eos_ids, pad_id, budget
        forcing, cache_phases and prompt_group (its max_new_tokens unused here).
      columns: N, the completion's columns.
      stop_ids: the policy tokens after which a row waits for the host; () for a run without
        pauses.
      max_wait_tokens: the most steps a waiting row waits before the loop stops.
      answer_width: O, the longest answer the host hands off, in tokens.
      continuous: the state's rows are slots that take the next of the R rows as theirs end
        (`start_slots`); False: every row has its own state row (`prefill`).
    """

    sampling: SamplingConfig
    columns: int
    stop_ids: tuple[int, ...] = ()
    max_wait_tokens: int = 0
    answer_width: int = 0
    continuous: bool = False

    @property
    def pauses(self) -> bool:
        return bool(self.stop_ids)

    @property
    def forcing(self) -> bool:
        return self.sampling.budget_forcing

    @property
    def phase_ends(self) -> tuple[int, ...]:
        return phase_ends(self.columns, self.sampling.cache_phases)

    @property
    def queue_width(self) -> int:
        """Q: the longest run of queued tokens (forced sequences, answers)."""
        s = self.sampling
        forced = max(len(s.end_thinking_ids), len(s.continuation_ids)) if self.forcing else 0
        return max(forced, self.answer_width if self.pauses else 0, 1)

    @property
    def recent_width(self) -> int:
        """The policy tokens a row remembers (the delimiter's and the stop sequence's)."""
        forced = len(self.sampling.end_thinking_ids) if self.forcing else 0
        return max(forced, len(self.stop_ids))


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


@flax.struct.dataclass
class DecodeState:
    """The loop's carry. Fields of a feature the spec lacks are None.

    Attributes:
      step: [] int32, the next column (continuous: the steps taken).
      row_ids: [B] int32, each row's index in the batch: its column t is sampled with the key
        fold_in(fold_in(key, row id), t), so a row's tokens depend on its key and index, not
        on the batch's other rows. Continuous: the row each of the B slots holds (R: none).
      last_token: [B] int32, the token to decode next.
      position: [B] int32, its rotary position.
      done: [B] bool, the row ended (EOS; or the host ended it).
      cache: the KVCache.
      tokens: [B, N] int32 columns (pad_id where nothing was written).
      logp: [B, N] float32, the policy's log-prob of each generated token (0 elsewhere).
      generated: [B, N] bool, the policy's tokens, forced ones included (the loss mask).
      forced: [B, N] bool, the tokens budget forcing wrote.
      observation: [B, N] bool, the environment's tokens (pauses).
      queue: [B, Q] int32, the tokens to write instead of the policy's (left-aligned).
      queue_pos: [B] int32, its next token; queue_len: [B] int32, its length.
      answering: [B] bool, the queue holds an answer (pauses).
      recent: [B, R] int32, the last R tokens of the policy (-1 before the first).
      thinking: [B] bool, before the end-of-thinking delimiter (forcing).
      think_count: [B] int32, thinking tokens written (forcing).
      pending: [B] bool, last_token was written at the last step (pauses; else ~done).
      waiting: [B] bool, the row closed a call and waits for the host (pauses).
      first_wait: [] int32, the step at which a row began to wait, or -1 (pauses).
      t: [B] int32, the next completion column of each slot's row (continuous).
      next_row: [] int32, the next row to start (continuous).
      prompts: the `Prefilled` group prompts a refill copies (continuous).

    Continuous, the outputs (tokens, logp, generated, forced, observation) are [R, N] by
    row and every other field is per slot; `done` marks a free slot.
    """

    step: jax.Array
    row_ids: jax.Array
    last_token: jax.Array
    position: jax.Array
    done: jax.Array
    cache: KVCache
    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array
    forced: jax.Array
    observation: jax.Array | None = None
    queue: jax.Array | None = None
    queue_pos: jax.Array | None = None
    queue_len: jax.Array | None = None
    answering: jax.Array | None = None
    recent: jax.Array | None = None
    thinking: jax.Array | None = None
    think_count: jax.Array | None = None
    pending: jax.Array | None = None
    waiting: jax.Array | None = None
    first_wait: jax.Array | None = None
    t: jax.Array | None = None
    next_row: jax.Array | None = None
    prompts: Prefilled | None = None


_SCALARS = ("step", "first_wait", "cache", "next_row", "prompts")


def initial_state(spec: DecodeSpec, cache: KVCache, position: jax.Array,
                  outputs: int | None = None) -> DecodeState:
    """The state before the first column: empty buffers for `position.shape[0]` rows.

    Args:
      spec: the DecodeSpec.
      cache: the KVCache after the prefill.
      position: [B] int32, each row's first generated position (its prompt length).
      outputs: the output buffers' rows (continuous: R; default B).
    """
    batch, n, q = position.shape[0], spec.columns, spec.queue_width
    rows = lambda dtype, fill=0: jnp.full((batch,), fill, dtype)
    out_rows = batch if outputs is None else outputs
    columns = lambda dtype, fill=0: jnp.full((out_rows, n), fill, dtype)
    has_queue = spec.forcing or spec.pauses
    return DecodeState(
        step=jnp.zeros((), jnp.int32), row_ids=jnp.arange(batch, dtype=jnp.int32),
        last_token=rows(jnp.int32), position=position,
        done=rows(bool), cache=cache, tokens=columns(jnp.int32, spec.sampling.pad_id),
        logp=columns(jnp.float32), generated=columns(bool), forced=columns(bool),
        observation=columns(bool) if spec.pauses else None,
        queue=jnp.zeros((batch, q), jnp.int32) if has_queue else None,
        queue_pos=rows(jnp.int32) if has_queue else None,
        queue_len=rows(jnp.int32) if has_queue else None,
        answering=rows(bool) if spec.pauses else None,
        recent=(jnp.full((batch, spec.recent_width), -1, jnp.int32)
                if spec.recent_width else None),
        thinking=rows(bool, True) if spec.forcing else None,
        think_count=rows(jnp.int32) if spec.forcing else None,
        pending=rows(bool) if spec.pauses else None,
        waiting=rows(bool) if spec.pauses else None,
        first_wait=jnp.full((), -1, jnp.int32) if spec.pauses else None)


def _padded(ids: Sequence[int], size: int) -> jax.Array:
    return jnp.asarray(list(ids) + [0] * (size - len(ids)), jnp.int32)


def _last(x: jax.Array, k: int) -> jax.Array:
    """The last k columns of [B, K] `x`."""
    return x if x.shape[1] == k else x[:, -k:]


def _is_eos(token: jax.Array, spec: DecodeSpec) -> jax.Array:
    """[B] bool: the token is one of the EOS ids."""
    if not spec.sampling.eos_ids:
        return jnp.zeros(token.shape, bool)
    eos = jnp.asarray(spec.sampling.eos_ids, jnp.int32)
    return jnp.any(token[:, None] == eos, -1)


def _write(s: DecodeState, logits, key, spec: DecodeSpec) -> DecodeState:
    """Writes one column for every row: the policy's token (sampled, or forced), the next
    token of an answer, or nothing (a waiting or ended row).

    Four pieces, in order: token choice (`_choose`); forcing, the tokens the policy did not
    choose, from the row's queue or started by budget forcing (`_unchosen`); feeding and
    pausing: which rows feed an answer or write a policy token (`_roles`), what a row
    remembers (`_remember`) and whether it now waits for the host (`_pause`); the layout's
    writer (`_write_columns`: column `step` of every row, or each slot's column t of its row).

    Args:
      s: the state before the column.
      logits: [B, V] float32, the model's next-token logits of each row.
      key: the run's PRNG key (row r samples column t with fold_in(fold_in(key, r), t)).
      spec: the DecodeSpec.

    Returns:
      The state after the column.
    """
    sampling = spec.sampling
    scaled = logits if sampling.greedy else logits / sampling.temperature
    ends = _thinking_ends(s, scaled.shape[-1], spec) if spec.forcing else None
    token, logp = _choose(s, scaled, key, spec, ends)
    from_queue, queued = _queue_head(s)
    feeding, policy = _roles(s, from_queue, spec)
    token, logp, forced, at_max, updates = _unchosen(s, token, logp, scaled, ends, from_queue,
                                                     queued, policy, spec)
    updates.update(_remember(s, token, policy, at_max, spec))
    eos_token = _is_eos(token, spec)
    if spec.pauses:
        written = feeding | policy
        updates.update(_pause(s, token, eos_token, written, policy, updates["recent"], spec))
        token = jnp.where(written, token, sampling.pad_id)
        advance = written
    else:
        token = jnp.where(policy, token, sampling.pad_id)
        updates["last_token"] = token
        advance = policy
    columns = {"tokens": token, "logp": jnp.where(policy, logp, 0.0), "generated": policy,
               "forced": forced & policy}
    if spec.pauses:
        columns["observation"] = feeding
    updates.update(_write_columns(s, columns, advance, spec))
    done = s.done | (policy & eos_token)
    if spec.continuous:  # a row ends when its columns run out (a waiting one: at the pause)
        updates["t"] = s.t + advance.astype(jnp.int32)
        full = updates["t"] >= spec.columns
        done = done | ((full & ~updates["waiting"]) if spec.pauses else full)
    return s.replace(step=s.step + 1, done=done, **updates)


def _thinking_ends(s: DecodeState, vocab: int, spec: DecodeSpec):
    """Budget forcing: which tokens would end thinking now, and which rows it is too early for.

    Returns:
      (too_early [B] bool: still thinking, under min_thinking_tokens; ends [B, V] bool: the
      tokens that end thinking, the delimiter's last token after its first E - 1 (given the
      row's last policy tokens) or an EOS).
    """
    sampling = spec.sampling
    end_ids = sampling.end_thinking_ids
    end = jnp.asarray(end_ids, jnp.int32)
    prefix_ok = jnp.all(_last(s.recent, len(end_ids))[:, 1:] == end[:-1], axis=-1)  # [B]
    vocab_ids = jnp.arange(vocab)
    ends = (vocab_ids[None, :] == end[-1]) & prefix_ok[:, None]
    if sampling.eos_ids:
        eos = jnp.asarray(sampling.eos_ids, jnp.int32)
        ends = ends | jnp.any(vocab_ids[:, None] == eos[None, :], -1)[None, :]
    too_early = s.thinking & (s.think_count < sampling.min_thinking_tokens)
    return too_early, ends


def _choose(s: DecodeState, scaled, key, spec: DecodeSpec, thinking_ends):
    """Token choice: the policy's token and its log-prob for every row.

    Greedy: the argmax, with its log-prob under `scaled`. Else a sample of the filtered
    (top_k, top_p) distribution with the key of the row's column (fold_in(fold_in(key, row
    id), column)), with its log-prob under that distribution. Budget forcing without
    continuation_ids masks out the tokens that would end thinking too early.

    Args:
      s: the state (row_ids; step, or continuous t: the column).
      scaled: [B, V] float32, the logits over the temperature.
      key: the run's PRNG key.
      spec: the DecodeSpec.
      thinking_ends: `_thinking_ends`, or None without budget forcing.

    Returns:
      (token [B] int32, logp [B] float32).
    """
    sampling = spec.sampling
    masked = scaled
    if thinking_ends is not None and not sampling.continuation_ids:
        too_early, ends = thinking_ends
        masked = jnp.where(too_early[:, None] & ends, -jnp.inf, scaled)
    if sampling.greedy:
        token = argmax(masked)
        return token, logp_at(scaled, token)
    column = s.t if spec.continuous else s.step
    return filter_and_sample(masked, row_keys(key, s.row_ids, column),
                             top_k=sampling.top_k, top_p=sampling.top_p)


def _queue_head(s: DecodeState):
    """(from_queue [B] bool: the row's queue has a token left; queued [B] int32: that
    token), or (None, None) for a spec without a queue."""
    if s.queue is None:
        return None, None
    from_queue = s.queue_pos < s.queue_len
    queued = jnp.take_along_axis(
        s.queue, jnp.minimum(s.queue_pos, s.queue.shape[1] - 1)[:, None], -1)[:, 0]
    return from_queue, queued


def _roles(s: DecodeState, from_queue, spec: DecodeSpec):
    """Feeding and pausing: which rows write what this column.

    Returns:
      (feeding [B] bool: the row writes its answer's next token (None without pauses);
      policy [B] bool: the row writes a policy token, sampled or forced (not ended, not
      waiting for the host, not being answered)).
    """
    if not spec.pauses:
        return None, ~s.done
    feeding = ~s.done & from_queue
    if spec.forcing:  # the queue may hold forced tokens instead
        feeding = feeding & s.answering
    return feeding, ~s.done & ~s.waiting & ~feeding


def _unchosen(s: DecodeState, token, logp, scaled, thinking_ends, from_queue, queued, policy,
              spec: DecodeSpec):
    """Forcing: the tokens the policy did not choose, in place of its choice. One queue per
    row holds them: the rest of a forced sequence or the environment's answer. A row with a
    queued token writes it; else budget forcing writes the delimiter's first token at
    max_thinking_tokens, or the continuation's first token in place of a premature end
    (one that `_choose` did not mask out), and queues the rest.

    Returns:
      (token [B] int32; logp [B] float32, a forced token's under `scaled`; forced [B] bool,
      a token from the queue or budget forcing; at_max [B] bool, the delimiter forced now
      (None without budget forcing); the state's updates).
    """
    forced = jnp.zeros(token.shape, bool)
    if s.queue is None:
        return token, logp, forced, None, {}
    step_pos = s.queue_pos + from_queue.astype(jnp.int32)
    if not spec.forcing:  # the queue holds answers only
        return jnp.where(from_queue, queued, token), logp, forced, None, {"queue_pos": step_pos}
    sampling = spec.sampling
    end_ids, continuation = sampling.end_thinking_ids, sampling.continuation_ids
    too_early, ends = thinking_ends
    at_max = (~from_queue & s.thinking & (sampling.max_thinking_tokens > 0)
              & (s.think_count >= sampling.max_thinking_tokens))
    if continuation:
        premature = ~from_queue & ~at_max & too_early & jnp.take_along_axis(
            ends, token[:, None], -1)[:, 0]
    else:  # already masked out of the distribution
        premature = jnp.zeros(token.shape, bool)
    if spec.pauses:  # a waiting row or one being answered writes no policy token
        at_max, premature = at_max & policy, premature & policy
    size = s.queue.shape[1]
    first = continuation[0] if continuation else 0
    token = jnp.where(from_queue, queued,
                      jnp.where(at_max, end_ids[0], jnp.where(premature, first, token)))
    forced = from_queue | at_max | premature
    counted = s.thinking & policy if spec.pauses else s.thinking
    updates = {
        "queue": jnp.where(at_max[:, None], _padded(end_ids[1:], size)[None],
                           jnp.where(premature[:, None], _padded(continuation[1:], size)[None],
                                     s.queue)),
        "queue_pos": jnp.where(at_max | premature, 0, step_pos),
        "queue_len": jnp.where(at_max, len(end_ids) - 1,
                               jnp.where(premature, max(len(continuation) - 1, 0),
                                         s.queue_len)),
        "think_count": s.think_count + counted.astype(jnp.int32)}
    if spec.pauses:
        updates["answering"] = s.answering & ~(at_max | premature)
    return token, jnp.where(forced, logp_at(scaled, token), logp), forced, at_max, updates


def _remember(s: DecodeState, token, policy, at_max, spec: DecodeSpec) -> dict:
    """The row's last policy tokens (`recent`) with this one, and budget forcing's
    `thinking` (ended by the forced or completed delimiter)."""
    updates = {}
    recent = s.recent
    if recent is not None:
        shifted = jnp.concatenate([recent[:, 1:], token[:, None]], axis=1)
        recent = jnp.where(policy[:, None], shifted, recent) if spec.pauses else shifted
        updates["recent"] = recent
    if spec.forcing:
        end_ids = spec.sampling.end_thinking_ids
        completed = jnp.all(_last(recent, len(end_ids)) == jnp.asarray(end_ids, jnp.int32),
                            axis=-1)
        updates["thinking"] = s.thinking & ~at_max & ~completed
    return updates


def _pause(s: DecodeState, token, eos_token, written, policy, recent,
           spec: DecodeSpec) -> dict:
    """Pausing: the token fed next (`last_token`, `pending`) and the rows that now wait
    for the host (their last policy tokens are stop_ids and not an EOS), with the step at
    which the first began to wait."""
    stop = jnp.all(_last(recent, len(spec.stop_ids))
                   == jnp.asarray(spec.stop_ids, jnp.int32)[None], -1)
    starts_waiting = policy & ~eos_token & stop
    return {"last_token": jnp.where(written, token, s.last_token), "pending": written,
            "waiting": s.waiting | starts_waiting,
            "first_wait": jnp.where((s.first_wait < 0) & jnp.any(starts_waiting), s.step,
                                    s.first_wait)}


def _write_columns(s: DecodeState, columns: dict, advance, spec: DecodeSpec) -> dict:
    """The layout's writer: each output buffer named in `columns` with its [B] values
    written. Static: column `step` of every row. Continuous: each slot's column t of the
    row it holds, for the slots that `advance` (a waiting or free slot writes nothing)."""
    if spec.continuous:
        out_rows = jnp.where(advance, s.row_ids, s.tokens.shape[0])  # others: dropped

        def write(buffer, value):
            return buffer.at[out_rows, s.t].set(value.astype(buffer.dtype), mode="drop")
    else:
        def write(buffer, value):
            return jax.lax.dynamic_update_slice(buffer, value[:, None].astype(buffer.dtype),
                                                (0, s.step))
    return {name: write(getattr(s, name), value) for name, value in columns.items()}


def _rows(model, tree):
    """Every array of `tree` with its rows (leading dim) split over the batch axes when the
    model is sharded (`Transformer.constrain`); scalars as they are."""
    if model.activation_sharding is None:
        return tree
    return jax.tree.map(
        lambda x: model.constrain(x, ("batch",) + (None,) * (x.ndim - 1)) if x.ndim else x,
        tree)


def _cache_rows(model, cache: KVCache) -> KVCache:
    """The cache's buffers with their rows ((batch row, KV head) pairs) placed by `_rows`."""
    return cache.replace(keys=_rows(model, cache.keys), values=_rows(model, cache.values),
                         key_valid=_rows(model, cache.key_valid))


def _matrices_in(state, dtype):
    """The model state with every floating matrix (ndim >= 2) cast to `dtype`; vectors (norm
    scales, whose float32 product the RMSNorm takes) as they are."""

    def cast(x):
        value = x.get_value()
        if value.ndim >= 2 and jnp.issubdtype(value.dtype, jnp.floating):
            return x.replace(value.astype(dtype))
        return x

    return jax.tree.map(cast, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def rollout_state(graphdef, state):
    """The model state a decode run reads: every matrix in the compute dtype (the forward
    pass casts each matrix it reads anyway: the samples are the same) and, on a mesh, the
    rollout layout (`parallel.rollout_rules`: the weights gathered whole over data x fsdp,
    once, so a decode step has no collective)."""
    model = nnx.merge(graphdef, state)
    state = _matrices_in(state, model.config.compute_dtype)
    if model.activation_sharding is not None:
        state = model.activation_sharding.rollout_state(state)
    return state


def _prefill_groups(model, prompts, prompt_mask, group: int, size: int):
    """Each prompt group's first row through the model once: (KVCache of `size` columns,
    [B / G, V] next-token logits, [B / G] positions of the first new token)."""
    group_prompts = first_of_groups(prompts, group)
    group_mask = first_of_groups(prompt_mask, group)
    cache = model.init_cache(group_prompts.shape[0], size)
    hidden, cache = model.decode(group_prompts, default_positions(group_mask), group_mask, cache)
    return cache, model.logits(hidden[:, -1]), group_mask.sum(-1).astype(jnp.int32)


def prefill(model, prompts, prompt_mask, key, spec: DecodeSpec,
            row_ids=None) -> DecodeState:
    """Runs the prompts through the model once per prompt group and writes column 0.

    Args:
      model: the Transformer (weights from `rollout_state`).
      prompts: [B, P] int32, left-padded; rows in contiguous groups of
        spec.sampling.prompt_group share one prompt.
      prompt_mask: [B, P] bool.
      key: PRNG key; row r chooses column t with fold_in(fold_in(key, r), t).
      spec: the DecodeSpec.
      row_ids: [B] int32, each row's identity r (default: its index): a row sampled with
        the same id, key and parameters writes the same tokens wherever it sits.

    Returns:
      The DecodeState after column 0, its cache sized for the first phase.
    """
    prompts, prompt_mask = _rows(model, (prompts, prompt_mask.astype(bool)))
    prompt_len = prompts.shape[1]
    g = spec.sampling.prompt_group
    cache, logits, _ = _prefill_groups(model, prompts, prompt_mask, g,
                                       prompt_len + spec.phase_ends[0])
    if g > 1:  # each group's prefill, broadcast to its rows (cache rows are b * K + k)
        kv_heads = model.config.num_kv_heads
        cache = cache.replace(
            keys=tuple(spread_to_groups(k, g, kv_heads) for k in cache.keys),
            values=tuple(spread_to_groups(v, g, kv_heads) for v in cache.values),
            key_valid=spread_to_groups(cache.key_valid, g))
        logits = spread_to_groups(logits, g)
    s = initial_state(spec, _cache_rows(model, cache),
                      prompt_mask.sum(-1).astype(jnp.int32))
    if row_ids is not None:
        s = s.replace(row_ids=jnp.asarray(row_ids, jnp.int32))
    s = s.replace(**_rows(model, {name: getattr(s, name) for name in s.__dataclass_fields__
                                  if name not in _SCALARS and getattr(s, name) is not None}))
    return _write(s, _rows(model, logits), key, spec)


def step(model, s: DecodeState, key, spec: DecodeSpec) -> DecodeState:
    """One decode step: the last written tokens into the cache, then the next column (the
    body of `run`'s loop). Continuous: free slots take their next rows first (`_refill`);
    a slot just filled feeds nothing and writes its first token from its group's prefill
    logits."""
    if not spec.continuous:
        valid = s.pending if spec.pauses else ~s.done
        hidden, cache = model.decode(s.last_token[:, None], s.position[:, None],
                                     valid[:, None], s.cache)
        advance = s.pending.astype(jnp.int32) if spec.pauses else 1
        s = s.replace(cache=cache, position=s.position + advance)
        logits = _rows(model, model.logits(hidden[:, 0]))
        return _write(s, logits, key, spec)
    s, fresh = _refill(model, s, spec)
    valid = (s.pending if spec.pauses else ~s.done) & ~fresh
    hidden, cache = model.decode(s.last_token[:, None], s.position[:, None], valid[:, None],
                                 s.cache)
    cache = cache.replace(index=jnp.where(valid, cache.index, s.cache.index))
    s = s.replace(cache=cache, position=s.position + valid.astype(jnp.int32))
    logits = model.logits(hidden[:, 0])

    def first_tokens(logits):  # a slot filled now: its group's prefill logits
        groups = s.prompts.logits.shape[0]
        group = jnp.minimum(s.row_ids // spec.sampling.prompt_group, groups - 1)
        return jnp.where(fresh[:, None], s.prompts.logits[group], logits)

    logits = jax.lax.cond(jnp.any(fresh), first_tokens, lambda logits: logits, logits)
    return _write(s, _rows(model, logits), key, spec)


def _refill(model, s: DecodeState, spec: DecodeSpec) -> tuple[DecodeState, jax.Array]:
    """Every free slot (`done`), in slot order, takes the next pending row: the row's state
    reset, its group's prompt keys and values copied into the slot's cache rows (the slot's
    later columns invalid, its cache index after the prompt). Returns (state, [S] bool: the
    slots filled now)."""
    total = s.tokens.shape[0]
    new_row = s.next_row + jnp.cumsum(s.done.astype(jnp.int32)) - 1
    take = s.done & (new_row < total)

    def fill(s: DecodeState) -> DecodeState:
        prompts = s.prompts
        kv_heads = model.config.num_kv_heads
        prompt_len = prompts.cache.key_valid.shape[1]
        group = jnp.where(take, new_row, 0) // spec.sampling.prompt_group
        source = (group[:, None] * kv_heads + jnp.arange(kv_heads)[None]).reshape(-1)
        taken = jnp.repeat(take, kv_heads)

        def copy(big, small, axis):  # the group's prompt into the first P columns
            head = jax.lax.slice_in_dim(big, 0, prompt_len, axis=axis)
            head = jnp.where(taken.reshape((-1,) + (1,) * (big.ndim - 1)),
                             small[source].astype(big.dtype), head)
            return jax.lax.dynamic_update_slice_in_dim(big, head, 0, axis)

        width = s.cache.key_valid.shape[1]
        valid = jnp.concatenate([prompts.cache.key_valid[group],
                                 jnp.zeros((group.shape[0], width - prompt_len), bool)], 1)
        cache = s.cache.replace(
            keys=tuple(copy(big, small, 2) for big, small in zip(s.cache.keys,
                                                                prompts.cache.keys)),
            values=tuple(copy(big, small, 1) for big, small in zip(s.cache.values,
                                                                  prompts.cache.values)),
            key_valid=jnp.where(take[:, None], valid, s.cache.key_valid),
            index=jnp.where(take, prompt_len, s.cache.index))
        reset = lambda x, value: None if x is None else jnp.where(
            take.reshape((-1,) + (1,) * (x.ndim - 1)), value, x)
        return s.replace(
            cache=_cache_rows(model, cache),
            row_ids=jnp.where(take, new_row, jnp.where(s.done, total, s.row_ids)),
            next_row=s.next_row + jnp.sum(take.astype(jnp.int32)),
            t=reset(s.t, 0), done=reset(s.done, False),
            position=reset(s.position, prompts.positions[group]),
            last_token=reset(s.last_token, 0), queue_pos=reset(s.queue_pos, 0),
            queue_len=reset(s.queue_len, 0), answering=reset(s.answering, False),
            recent=reset(s.recent, -1), thinking=reset(s.thinking, True),
            think_count=reset(s.think_count, 0), pending=reset(s.pending, False),
            waiting=reset(s.waiting, False))

    return jax.lax.cond(jnp.any(take), fill, lambda s: s, s), take


def start_slots(model, prompts, prompt_mask, spec: DecodeSpec, slots: int) -> DecodeState:
    """The continuous state before the first step: the R prompts prefilled once per prompt
    group (`Prefilled`), `slots` empty slots with the first cache phase's P + E columns
    each (`grow` widens them), [R, N] outputs.

    Args:
      model: the Transformer (weights from `rollout_state`).
      prompts: [R, P] int32, left-padded; prompt_mask: [R, P] bool (rows in contiguous
        groups of spec.sampling.prompt_group sharing one prompt).
      spec: a DecodeSpec with continuous=True.
      slots: S, 1 <= S <= R.
    """
    if not spec.continuous:
        raise ValueError("start_slots: the DecodeSpec must have continuous=True")
    total, prompt_len = prompts.shape
    if not 1 <= slots <= total:
        raise ValueError(f"start_slots: slots must be in [1, {total}], got {slots}")
    g = spec.sampling.prompt_group
    prefilled = Prefilled(*_prefill_groups(model, prompts, prompt_mask.astype(bool), g,
                                           prompt_len))
    cache = model.init_cache(slots, prompt_len + spec.phase_ends[0])
    cache = cache.replace(index=jnp.full((slots,), prompt_len, jnp.int32))
    s = initial_state(spec, _cache_rows(model, cache), jnp.zeros((slots,), jnp.int32),
                      outputs=total)
    return s.replace(row_ids=jnp.full((slots,), total, jnp.int32),
                     done=jnp.ones((slots,), bool), t=jnp.zeros((slots,), jnp.int32),
                     next_row=jnp.zeros((), jnp.int32), prompts=prefilled)


def _going(s: DecodeState):
    """[] bool: some row can write a column without the host (continuous: or a free slot can
    take a pending row)."""
    going = ~jnp.all(s.done) if s.waiting is None else jnp.any(~s.done & ~s.waiting)
    if s.next_row is not None:
        going = going | (jnp.any(s.done) & (s.next_row < s.tokens.shape[0]))
    return going


def paused(s: DecodeState, spec: DecodeSpec) -> jax.Array:
    """[] bool, the pause rule: a row waits for the host, and it has waited max_wait_tokens
    steps, or the columns ran out, or no other row can go on. Always False without pauses."""
    if not spec.pauses:
        return jnp.zeros((), bool)
    waited = (s.first_wait >= 0) & (s.step - s.first_wait >= spec.max_wait_tokens)
    waits = s.waiting & ~s.done
    full = (jnp.any(waits & (s.t >= spec.columns)) if spec.continuous
            else s.step >= spec.columns)
    return jnp.any(waits) & (waited | full | ~_going(s))


def run(model, s: DecodeState, key, spec: DecodeSpec, end: int) -> DecodeState:
    """Decodes columns until column `end` (the end of the cache's phase), every row is done, or
    the loop pauses for the host.

    Args:
      model: the Transformer (weights from `rollout_state`).
      s: the state; its cache holds P + end columns.
      key: PRNG key (row r chooses column t with fold_in(fold_in(key, r), t)).
      spec: the DecodeSpec.
      end: the phase's last column + 1 (static; continuous: unused, the loop stops when a
        slot's row reaches the cache's last column, `at_edge`).

    Returns:
      The state after the last column written.
    """
    if spec.continuous:  # until a slot with a row reaches the cache phase's last column
        cond = lambda s: _going(s) & ~paused(s, spec) & ~at_edge(s)
    elif spec.pauses:
        cond = lambda s: (s.step < end) & _going(s) & ~paused(s, spec)
    else:
        cond = lambda s: (s.step < end) & _going(s)
    return jax.lax.while_loop(cond, lambda s: step(model, s, key, spec), s)


def at_edge(s: DecodeState) -> jax.Array:
    """[] bool, continuous: a slot holding a row has reached its cache's last column (the
    cache must grow before it can feed its next token)."""
    width = s.cache.key_valid.shape[1]
    return jnp.any(~s.done & (s.cache.index >= width))


def grow(model, s: DecodeState, size: int) -> DecodeState:
    """The state with its cache grown to `size` columns (the next phase)."""
    return s.replace(cache=_cache_rows(model, s.cache.grow(size)))


def hand_off(s: DecodeState, answers, lengths, answered, ended) -> DecodeState:
    """The host's answers queued for the rows that waited; the loop writes them next.

    Args:
      s: a paused DecodeState with pauses.
      answers: [B, Q] int32, each answer left-aligned.
      lengths: [B] int32, its length.
      answered: [B] bool, the rows that get their answer.
      ended: [B] bool, the rows whose episode ends here instead.
    """
    return s.replace(
        queue=jnp.where(answered[:, None], answers, s.queue),
        queue_len=jnp.where(answered, lengths, s.queue_len),
        queue_pos=jnp.where(answered, 0, s.queue_pos),
        answering=s.answering | answered,
        waiting=s.waiting & ~answered,
        done=s.done | ended,
        recent=jnp.where(answered[:, None], -1, s.recent),
        first_wait=jnp.full((), -1, jnp.int32))
