"""On-device sampler: one prefill pass, then a `lax.while_loop` of cached decode steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models.transformer import (KVCache, default_positions, first_of_groups,
                                         spread_to_groups)


_MIN_PHASE = 16  # new tokens per cache phase at least (each phase is one more compiled loop)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling settings (hashable: a jit static argument; a new value recompiles).

    Attributes:
      max_new_tokens: completion buffer length N.
      temperature: logits are divided by it before sampling (> 0).
      top_k: keep the k most likely tokens; 0 keeps all.
      top_p: keep the smallest set of most likely tokens with mass >= top_p; 1.0 keeps all.
      greedy: take the argmax (temperature/top-k/top-p ignored).
      eos_ids: token ids that end a row (the EOS is kept in the output and in the mask).
      pad_id: written after a row ends.
      min_thinking_tokens: budget forcing (s1, https://arxiv.org/abs/2501.19393): before this
        many thinking tokens the end-of-thinking delimiter and EOS are not allowed. With
        continuation_ids they are replaced by that continuation (e.g. "Wait"); without, they
        are masked out of the sampling distribution.
      max_thinking_tokens: budget forcing: after this many thinking tokens the delimiter is
        forced; 0 disables the maximum.
      end_thinking_ids: the token sequence of the end-of-thinking delimiter (e.g. the ids of
        "</think>"); thinking is the span from the first generated token to the delimiter.
      continuation_ids: ids inserted in place of a premature delimiter/EOS.
      cache_phases: the KV cache grows in up to this many steps of at least 16 new tokens
        (one decode loop per step), so early tokens attend over a short buffer instead of the
        whole prompt + max_new_tokens one; 1 allocates it all at once. Each phase compiles its
        own copy of the decode step. Samples do not depend on it beyond float rounding.
      prompt_group: rows come in contiguous groups of this many sharing one prompt (the G
        completions per prompt of an RL batch): the prefill runs once per group and its
        KV cache is broadcast to the group's rows. 1 prefills every row.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    min_thinking_tokens: int = 0
    max_thinking_tokens: int = 0
    end_thinking_ids: tuple[int, ...] = ()
    continuation_ids: tuple[int, ...] = ()
    cache_phases: int = 4
    prompt_group: int = 1

    def __post_init__(self):
        for name in ("eos_ids", "end_thinking_ids", "continuation_ids"):
            value = getattr(self, name)
            if isinstance(value, (int, np.integer)):
                value = (value,)
            object.__setattr__(self, name, tuple(int(v) for v in value))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(
                f"SamplingConfig.max_new_tokens must be a positive int, got {self.max_new_tokens!r}"
            )
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"SamplingConfig.temperature must be > 0, got {self.temperature!r}")
        if not isinstance(self.cache_phases, int) or self.cache_phases < 1:
            raise ValueError(
                f"SamplingConfig.cache_phases must be an int >= 1, got {self.cache_phases!r}"
            )
        if not isinstance(self.prompt_group, int) or self.prompt_group < 1:
            raise ValueError(
                f"SamplingConfig.prompt_group must be an int >= 1, got {self.prompt_group!r}"
            )
        if self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if self.min_thinking_tokens < 0 or self.max_thinking_tokens < 0:
            raise ValueError("SamplingConfig.min_thinking_tokens/max_thinking_tokens must be >= 0")
        if (self.min_thinking_tokens or self.max_thinking_tokens) and not self.end_thinking_ids:
            raise ValueError(
                "SamplingConfig budget forcing needs end_thinking_ids (the delimiter ids)"
            )
        if self.max_thinking_tokens and self.min_thinking_tokens > self.max_thinking_tokens:
            raise ValueError(
                f"SamplingConfig.min_thinking_tokens={self.min_thinking_tokens} exceeds "
                f"max_thinking_tokens={self.max_thinking_tokens}"
            )

    @property
    def phase_ends(self) -> tuple[int, ...]:
        """Completion columns at which each decode phase ends (the last is max_new_tokens)."""
        length = max(_MIN_PHASE, -(-self.max_new_tokens // self.cache_phases))
        return tuple(range(length, self.max_new_tokens, length)) + (self.max_new_tokens,)

    @property
    def budget_forcing(self) -> bool:
        return bool(self.end_thinking_ids) and bool(
            self.min_thinking_tokens or self.max_thinking_tokens
        )


@flax.struct.dataclass
class SampleOutput:
    """Completions of one `generate` call.

    Attributes:
      tokens: [B, N] int32, pad_id after EOS (EOS included).
      logp: [B, N] float32 log-probability of each token under the sampling distribution
        (temperature, top-k, top-p and budget-forcing masks applied); for greedy decoding and
        for forced tokens, under the temperature-scaled model distribution. 0 where masked.
      mask: [B, N] bool, True for generated tokens up to and including EOS.
      lengths: [B] int32 = mask.sum(-1).
      forced: [B, N] bool, True where budget forcing inserted the token.
    """

    tokens: jax.Array
    logp: jax.Array
    mask: jax.Array
    lengths: jax.Array
    forced: jax.Array


@flax.struct.dataclass
class _State:
    step: jax.Array  # [] int32: index of the next completion column
    last_token: jax.Array  # [B] int32
    position: jax.Array  # [B] int32 rotary position of the next token
    done: jax.Array  # [B] bool
    cache: KVCache
    tokens: jax.Array  # [B, N]
    logp: jax.Array  # [B, N]
    mask: jax.Array  # [B, N]
    forced: jax.Array  # [B, N]
    thinking: jax.Array  # [B] bool: still before the end-of-thinking delimiter
    think_count: jax.Array  # [B] int32: thinking tokens emitted so far
    history: jax.Array  # [B, E] int32: the last E emitted tokens (E = delimiter length)
    queue: jax.Array  # [B, Q] int32: forced tokens still to emit
    queue_pos: jax.Array  # [B] int32
    queue_len: jax.Array  # [B] int32


def _padded(ids: Sequence[int], size: int) -> jax.Array:
    return jnp.asarray(list(ids) + [0] * (size - len(ids)), jnp.int32)


def _argmax(x):
    """First index of the maximum along the last axis, as jnp.argmax (x: [B, V] -> [B] int32).

    max then min-of-matching-index: two plain reductions, which XLA:CPU runs far faster than
    the variadic (value, index) reduction jnp.argmax lowers to.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    # A row with no maximum (all NaN) would give V: never an id outside the vocabulary (its
    # log-prob is NaN, which `rl.rollout` reports as an error).
    return jnp.minimum(jnp.min(jnp.where(x == top, iota, x.shape[-1]), axis=-1),
                       x.shape[-1] - 1)


def _categorical(key, logits):
    """Gumbel-max sample argmax(logits + G), G ~ Gumbel(0, 1) (the noise jax.random.categorical
    draws for the same key, so the samples are the same).

    Args:
      logits: [B, V] float32 unnormalised log-probabilities.

    Returns:
      [B] int32.
    """
    return _argmax(logits + jax.random.gumbel(key, logits.shape, logits.dtype))


def _logp_at(logits, token):
    """log softmax(logits)[token] = logits[token] - logsumexp(logits); logits [B, V] -> [B]."""
    picked = jnp.take_along_axis(logits, token[:, None], -1)[:, 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def _filter_and_sample(logits, key, config: SamplingConfig):
    """Samples one token per row after temperature / top-k / top-p.

    Args:
      logits: [B, V] float32, already temperature-scaled with forbidden tokens at -inf.
      key: PRNG key.
      config: the SamplingConfig.

    Returns:
      (token [B] int32, logp [B] float32 under the filtered distribution).
    """
    vocab = logits.shape[-1]
    k = config.top_k if config.top_k > 0 else (vocab if config.top_p < 1.0 else 0)
    if k == 0:
        token = _categorical(key, logits)
        return token, _logp_at(logits, token)
    values, indices = jax.lax.top_k(logits, min(k, vocab))
    if config.top_p < 1.0:
        probs = jax.nn.softmax(values, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        values = jnp.where(mass_before < config.top_p, values, -jnp.inf)
    choice = _categorical(key, values)
    logp = _logp_at(values, choice)
    token = jnp.take_along_axis(indices, choice[:, None], -1)[:, 0]
    return token.astype(jnp.int32), logp


def _choose(state: _State, logits, key, config: SamplingConfig):
    """One sampling decision per row, including budget forcing; returns the new state."""
    batch, vocab = logits.shape
    step = state.step
    eos = jnp.asarray(config.eos_ids, jnp.int32) if config.eos_ids else None
    is_eos = lambda t: (
        jnp.any(t[:, None] == eos, -1) if eos is not None else jnp.zeros(t.shape, bool)
    )
    scaled = logits if config.greedy else logits / config.temperature
    unmasked = scaled
    model_logp = lambda t: _logp_at(unmasked, t)  # under the temperature-scaled model
    end_ids = config.end_thinking_ids

    ends_thinking = None
    if config.budget_forcing:
        # A token "ends thinking" if it completes the delimiter (given the last E-1 tokens) or is
        # an EOS.
        end = jnp.asarray(end_ids, jnp.int32)
        prefix_ok = jnp.all(state.history[:, 1:] == end[:-1], axis=-1)  # [B]
        vocab_ids = jnp.arange(vocab)
        vocab_ends = (vocab_ids[None, :] == end[-1]) & prefix_ok[:, None]
        if eos is not None:
            vocab_ends = vocab_ends | jnp.any(vocab_ids[:, None] == eos[None, :], -1)[None, :]
        too_early = state.thinking & (state.think_count < config.min_thinking_tokens)
        if not config.continuation_ids:
            scaled = jnp.where(too_early[:, None] & vocab_ends, -jnp.inf, scaled)
        ends_thinking = lambda t: jnp.take_along_axis(vocab_ends, t[:, None], -1)[:, 0]

    if config.greedy:
        token = _argmax(scaled)
        logp = model_logp(token)
    else:
        token, logp = _filter_and_sample(scaled, key, config)
    forced = jnp.zeros((batch,), bool)

    queue, queue_pos, queue_len = state.queue, state.queue_pos, state.queue_len
    thinking, think_count, history = state.thinking, state.think_count, state.history
    if config.budget_forcing:
        queue_size = queue.shape[1]
        from_queue = queue_pos < queue_len
        queued = jnp.take_along_axis(queue, jnp.minimum(queue_pos, queue_size - 1)[:, None], -1)[
            :, 0
        ]
        at_max = (
            ~from_queue
            & thinking
            & (config.max_thinking_tokens > 0)
            & (think_count >= config.max_thinking_tokens)
        )
        premature = ~from_queue & ~at_max & too_early & ends_thinking(token)
        if not config.continuation_ids:
            premature = jnp.zeros_like(premature)  # already masked out of the distribution
        end_queue = _padded(end_ids[1:], queue_size)
        cont_queue = _padded(config.continuation_ids[1:], queue_size)
        first_end = end_ids[0]
        first_cont = config.continuation_ids[0] if config.continuation_ids else 0
        token = jnp.where(
            from_queue,
            queued,
            jnp.where(at_max, first_end, jnp.where(premature, first_cont, token)),
        )
        forced = from_queue | at_max | premature
        queue = jnp.where(
            at_max[:, None], end_queue[None], jnp.where(premature[:, None], cont_queue[None], queue)
        )
        queue_pos = jnp.where(at_max | premature, 0, queue_pos + from_queue.astype(jnp.int32))
        queue_len = jnp.where(
            at_max,
            len(end_ids) - 1,
            jnp.where(premature, max(len(config.continuation_ids) - 1, 0), queue_len),
        )
        logp = jnp.where(forced, model_logp(token), logp)
        think_count = think_count + thinking.astype(jnp.int32)
        history = jnp.concatenate([history[:, 1:], token[:, None]], axis=1)
        completed = jnp.all(history == jnp.asarray(end_ids, jnp.int32), axis=-1)
        thinking = thinking & ~at_max & ~completed

    active = ~state.done
    token = jnp.where(active, token, config.pad_id)
    logp = jnp.where(active, logp, 0.0)
    forced = forced & active
    done = state.done | (active & is_eos(token))
    write = lambda buf, x: jax.lax.dynamic_update_slice(
        buf,
        x[:, None].astype(buf.dtype),
        (0, step),
    )
    return state.replace(
        step=step + 1,
        last_token=token,
        done=done,
        tokens=write(state.tokens, token),
        logp=write(state.logp, logp),
        mask=write(state.mask, active),
        forced=write(state.forced, forced),
        thinking=thinking,
        think_count=think_count,
        history=history,
        queue=queue,
        queue_pos=queue_pos,
        queue_len=queue_len,
    )


def _rows(model, tree):
    """Every array of `tree` with its rows (leading dim) split over the batch axes when the
    model is sharded (`Transformer.constrain`); scalars and the rotary tables as they are."""
    if model.activation_sharding is None:
        return tree
    return jax.tree.map(
        lambda x: model.constrain(x, ("batch",) + (None,) * (x.ndim - 1)) if x.ndim else x,
        tree)


def _matrices_in(state, dtype):
    """The model state with every floating matrix (ndim >= 2) cast to `dtype`; vectors (norm
    scales, whose float32 product the RMSNorm takes) as they are."""

    def cast(x):
        value = x.get_value()
        if value.ndim >= 2 and jnp.issubdtype(value.dtype, jnp.floating):
            return x.replace(value.astype(dtype))
        return x

    return jax.tree.map(cast, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _cache_rows(model, cache: KVCache) -> KVCache:
    """The cache's buffers with their rows ((batch row, KV head) pairs) placed by `_rows`."""
    return cache.replace(keys=_rows(model, cache.keys), values=_rows(model, cache.values),
                         key_valid=_rows(model, cache.key_valid))


def _generate_core(graphdef, state, prompts, prompt_mask, key, config: SamplingConfig):
    model = nnx.merge(graphdef, state)
    # The weights in the compute dtype once, before the loop (the forward pass casts every
    # matrix it reads anyway: the samples are the same); on several devices the rollout
    # layout: one gather of them, rows over the batch axes, no collective in a decode step.
    state = _matrices_in(state, model.config.compute_dtype)
    if model.activation_sharding is not None:
        state = model.activation_sharding.rollout_state(state)
    model = nnx.merge(graphdef, state)
    prompts, prompt_mask = _rows(model, (prompts, prompt_mask))
    batch, prompt_len = prompts.shape
    n = config.max_new_tokens
    prompt_mask = prompt_mask.astype(bool)

    phase_ends = config.phase_ends
    # Step k (completion column k) writes the keys of token k - 1 at slot prompt_len + k - 1.
    g = config.prompt_group
    group_prompts, group_mask = first_of_groups(prompts, g), first_of_groups(prompt_mask, g)
    cache = model.init_cache(batch // g, prompt_len + phase_ends[0])
    hidden, cache = model.decode(group_prompts, default_positions(group_mask), group_mask, cache)
    logits = model.logits(hidden[:, -1])
    if g > 1:  # each group's prefill, broadcast to its rows (cache rows are b * K + k)
        kv_heads = model.config.num_kv_heads
        cache = cache.replace(
            keys=tuple(spread_to_groups(k, g, kv_heads) for k in cache.keys),
            values=tuple(spread_to_groups(v, g, kv_heads) for v in cache.values),
            key_valid=spread_to_groups(cache.key_valid, g))
        logits = spread_to_groups(logits, g)
    cache = _cache_rows(model, cache)

    delimiter = max(len(config.end_thinking_ids), 1)
    queue_size = max(len(config.end_thinking_ids), len(config.continuation_ids), 1)
    sample_state = _State(
        step=jnp.zeros((), jnp.int32),
        last_token=jnp.zeros((batch,), jnp.int32),
        position=prompt_mask.sum(-1).astype(jnp.int32),
        done=jnp.zeros((batch,), bool),
        cache=cache,
        tokens=jnp.full((batch, n), config.pad_id, jnp.int32),
        logp=jnp.zeros((batch, n), jnp.float32),
        mask=jnp.zeros((batch, n), bool),
        forced=jnp.zeros((batch, n), bool),
        thinking=jnp.ones((batch,), bool),
        think_count=jnp.zeros((batch,), jnp.int32),
        history=jnp.full((batch, delimiter), -1, jnp.int32),
        queue=jnp.zeros((batch, queue_size), jnp.int32),
        queue_pos=jnp.zeros((batch,), jnp.int32),
        queue_len=jnp.zeros((batch,), jnp.int32),
    )
    row_fields = ("last_token", "position", "done", "tokens", "logp", "mask", "forced",
                  "thinking", "think_count", "history", "queue", "queue_pos", "queue_len")
    sample_state = sample_state.replace(**_rows(model, {
        name: getattr(sample_state, name) for name in row_fields}))
    sample_state = _choose(sample_state, _rows(model, logits), jax.random.fold_in(key, 0),
                           config)

    def body(s: _State):
        hidden, cache = model.decode(
            s.last_token[:, None], s.position[:, None], ~s.done[:, None], s.cache
        )
        s = s.replace(cache=cache, position=s.position + 1)
        logits = _rows(model, model.logits(hidden[:, 0]))
        return _choose(s, logits, jax.random.fold_in(key, s.step), config)

    final = sample_state
    for phase, end in enumerate(phase_ends):
        if phase:
            final = final.replace(cache=_cache_rows(model, final.cache.grow(prompt_len + end)))
        cond = lambda s, end=end: (s.step < end) & ~jnp.all(s.done)
        final = jax.lax.while_loop(cond, body, final)
    return SampleOutput(
        tokens=final.tokens,
        logp=final.logp,
        mask=final.mask,
        lengths=final.mask.sum(-1).astype(jnp.int32),
        forced=final.forced,
    )


_generate_jit = jax.jit(_generate_core, static_argnames=("graphdef", "config"))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def generate(graphdef, state, prompts, prompt_mask, key, *, config: SamplingConfig) -> SampleOutput:
    """Samples completions for a left-padded prompt batch (compiled once per shape and config).

    Prefill runs the prompt through the model in one pass; decoding is a `lax.while_loop` on
    step < N and not all rows done, with the step key fold_in(key, step), split into
    `config.cache_phases` loops over a growing KV cache.

    Args:
      graphdef: from `nnx.split(model)` (static).
      state: the model state from `nnx.split(model)`.
      prompts: [B, P] int32 token ids, left-padded to the bucket P.
      prompt_mask: [B, P] bool, False at padding; each row needs at least one True.
      key: PRNG key.
      config: SamplingConfig (static).

    Returns:
      SampleOutput with tokens/logp/mask/forced [B, N] and lengths [B].
    """
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"generate: config must be a SamplingConfig, got {type(config).__name__}")
    prompts = jnp.asarray(prompts) if not isinstance(prompts, jax.Array) else prompts
    prompt_mask = (
        jnp.asarray(prompt_mask) if not isinstance(prompt_mask, jax.Array) else prompt_mask
    )
    if prompts.ndim != 2:
        raise ValueError(f"generate: prompts must be [B, P], got shape {prompts.shape}")
    if prompt_mask.shape != prompts.shape:
        raise ValueError(
            f"generate: prompt_mask shape {prompt_mask.shape} != prompts shape {prompts.shape}"
        )
    if not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(f"generate: prompts must be integer token ids, got {prompts.dtype}")
    g = config.prompt_group
    if prompts.shape[0] % g:
        raise ValueError(f"generate: config.prompt_group {g} does not divide the batch of "
                         f"{prompts.shape[0]} prompts")
    # (a global array of a multi-controller run is checked by each process on its rows)
    if g > 1 and _is_concrete(prompts) and getattr(prompts, "is_fully_addressable", True):
        check_prompt_groups(prompts, prompt_mask, g)
    if _is_concrete(prompt_mask) and getattr(prompt_mask, "is_fully_addressable", True):
        mask = np.asarray(prompt_mask).astype(bool)
        empty = np.flatnonzero(~mask.any(-1))
        if empty.size:
            raise ValueError(
                f"generate: prompt row {int(empty[0])} is empty (prompt_mask all False)"
            )
        not_left = np.flatnonzero((mask[:, :-1] & ~mask[:, 1:]).any(-1))
        if not_left.size:
            raise ValueError(
                f"generate: prompt row {int(not_left[0])} is not left-padded "
                "(a padding position follows a real token)"
            )
    return _generate_jit(
        graphdef, state, prompts.astype(jnp.int32), prompt_mask.astype(bool), key, config=config
    )


def check_prompt_groups(prompt_tokens, prompt_mask, group_size: int) -> None:
    """Raises ValueError unless rows g*G .. g*G + G - 1 share their prompt tokens and mask."""
    tokens, mask = np.asarray(prompt_tokens), np.asarray(prompt_mask, bool)
    rows = tokens.shape[0]
    if group_size < 1 or rows % group_size:
        raise ValueError(f"prompt groups: {rows} rows are not whole groups of {group_size}")
    for name, x in (("tokens", tokens), ("mask", mask)):
        grouped = x.reshape(rows // group_size, group_size, -1)
        bad = np.flatnonzero(np.any(grouped != grouped[:, :1], axis=(1, 2)))
        if len(bad):
            g = int(bad[0])
            raise ValueError(f"prompt groups: rows {g * group_size}..{(g + 1) * group_size - 1}"
                             f" should share one prompt but their prompt {name} differ")


def pad_prompts(prompts: Sequence[Sequence[int]], bucket: int, *, pad_id: int = 0):
    """Left-pads token-id lists into a [B, bucket] batch; a prompt longer than bucket is an error.

    Args:
      prompts: B lists of token ids.
      bucket: the padded length P.
      pad_id: id written at padding positions.

    Returns:
      (tokens [B, P] int32 numpy, mask [B, P] bool numpy).
    """
    tokens = np.full((len(prompts), bucket), pad_id, np.int32)
    mask = np.zeros((len(prompts), bucket), bool)
    for row, ids in enumerate(prompts):
        if len(ids) > bucket:
            raise ValueError(
                f"prompt row {row} has {len(ids)} tokens, longer than the bucket of "
                f"{bucket}; use a larger bucket (prompts are never truncated)"
            )
        if len(ids) == 0:
            raise ValueError(f"prompt row {row} is empty")
        tokens[row, bucket - len(ids) :] = ids
        mask[row, bucket - len(ids) :] = True
    return tokens, mask
