"""Multi-turn episodes: the policy generates until it closes a tool call, the environment
answers, and the sampler continues from its KV cache with the answer appended.

    out = generate_episodes(graphdef, state, prompts, prompt_mask, key, config=config,
                            tokenizer=tokenizer, observe=environment)

Each row's completion is a run of slots after its left-padded prompt. A slot holds a token
the policy generated (`generated`: it carries the loss), an observation token the
environment wrote (`observation`: attended to, never in the loss or the KL), or nothing (a
hole, masked out of attention: a row waiting for the others to end their turn). A turn ends
for a row when its last generated tokens are `config.stop_ids` (the call's closing tag); the
on-device loop runs until every row has ended its turn or its episode, then the host reads
each waiting row's text since its last observation, asks `observe(text)` for the answer,
and the answer's tokens are decoded into the cache in one chunk (left-padded, so that the
next generated token directly follows the answer's last token). No turn re-reads the
history: the prompt is prefilled once and every later token is decoded once.

The layout keeps teacher forcing exact: every generated token follows a valid slot (its
previous generated token, the answer's last token, or the prompt's), so the trainer's
log-probs of `[prompt | slots]` under the attention mask `prompt_mask | generated |
observation` are the sampler's (`models.completion_logprobs`; tests/test_episodes.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models.transformer import KVCache, default_positions
from grpo_jax.sampling.sampler import SamplingConfig, _argmax, _filter_and_sample, _logp_at


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Static settings of multi-turn sampling (hashable).

    Attributes:
      max_tokens: N, the completion's slots: generated and observation tokens and holes.
      stop_ids: the token ids that end a turn (a tool call's closing tag).
      max_turns: the most observations an episode gets; a row that ends turn max_turns + 1
        with a call ends its episode there.
      max_observation_tokens: O, the width of an observation chunk; a longer answer is cut.
      sampling: temperature, top_k, top_p, greedy, eos_ids and pad_id as in SamplingConfig
        (max_new_tokens and the budget-forcing fields unused).
    """

    max_tokens: int
    stop_ids: tuple[int, ...]
    max_turns: int = 4
    max_observation_tokens: int = 32
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=1)

    def __post_init__(self):
        if self.max_tokens < 1 or self.max_observation_tokens < 1 or self.max_turns < 0:
            raise ValueError(f"EpisodeConfig: max_tokens and max_observation_tokens must be "
                             f">= 1 and max_turns >= 0, got {self}")
        if not self.stop_ids:
            raise ValueError("EpisodeConfig.stop_ids: the tokens that end a turn are needed")


@flax.struct.dataclass
class EpisodeOutput:
    """Sampled episodes.

    Attributes:
      tokens: [B, N] int32 slots (pad where nothing was written).
      logp: [B, N] float32, the sampler's log-probs of the generated tokens (0 elsewhere).
      generated: [B, N] bool, the policy's tokens (the loss mask).
      observation: [B, N] bool, the environment's tokens.
      turns: [B] int32, observations each row received.
      length: [] int32, the slots written (the rest of the N are empty).
    """

    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array
    observation: jax.Array
    turns: jax.Array
    length: jax.Array

    @property
    def attention_mask(self) -> jax.Array:
        """[B, N] bool: the slots the model attends to."""
        return self.generated | self.observation


@flax.struct.dataclass
class _State:
    step: jax.Array  # [] the next slot
    last_token: jax.Array  # [B] the token whose keys and values are written next
    position: jax.Array  # [B] its rotary position
    done: jax.Array  # [B] the episode ended (EOS, budget)
    waiting: jax.Array  # [B] the turn ended with the stop sequence
    parked: jax.Array  # [B] waiting, and its last token is in the cache
    recent: jax.Array  # [B, L] the last L generated tokens (L = len(stop_ids))
    cache: KVCache
    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array
    observation: jax.Array


def _choose(s: _State, logits, key, config: EpisodeConfig) -> _State:
    """One token for every row that is neither done nor waiting, written at slot s.step."""
    sampling = config.sampling
    active = ~s.done & ~s.waiting
    scaled = logits if sampling.greedy else logits / sampling.temperature
    if sampling.greedy:
        token = _argmax(scaled)
        logp = _logp_at(scaled, token)
    else:
        token, logp = _filter_and_sample(scaled, key, sampling)
    eos = (jnp.any(token[:, None] == jnp.asarray(sampling.eos_ids, jnp.int32)[None], -1)
           if sampling.eos_ids else jnp.zeros(token.shape, bool))
    recent = jnp.where(active[:, None],
                       jnp.concatenate([s.recent[:, 1:], token[:, None]], 1), s.recent)
    stop = jnp.all(recent == jnp.asarray(config.stop_ids, jnp.int32)[None], -1)

    def write(buffer, value):
        column = jnp.where(active, value, jnp.zeros_like(value)).astype(buffer.dtype)
        return jax.lax.dynamic_update_slice(buffer, column[:, None], (0, s.step))

    return s.replace(
        step=s.step + 1,
        last_token=jnp.where(active, token, s.last_token),
        done=s.done | (active & eos),
        waiting=s.waiting | (active & ~eos & stop),
        recent=recent,
        tokens=write(s.tokens, jnp.where(active, token, sampling.pad_id)),
        logp=write(s.logp, logp),
        generated=write(s.generated, active),
    )


def _start(graphdef, state, prompts, prompt_mask, key, config: EpisodeConfig) -> _State:
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompts.shape
    n = config.max_tokens
    mask = prompt_mask.astype(bool)
    cache = model.init_cache(batch, prompt_len + n)
    hidden, cache = model.decode(prompts, default_positions(mask), mask, cache)
    s = _State(
        step=jnp.zeros((), jnp.int32), last_token=jnp.zeros((batch,), jnp.int32),
        position=mask.sum(-1).astype(jnp.int32), done=jnp.zeros((batch,), bool),
        waiting=jnp.zeros((batch,), bool), parked=jnp.zeros((batch,), bool),
        recent=jnp.full((batch, len(config.stop_ids)), -1, jnp.int32), cache=cache,
        tokens=jnp.full((batch, n), config.sampling.pad_id, jnp.int32),
        logp=jnp.zeros((batch, n), jnp.float32), generated=jnp.zeros((batch, n), bool),
        observation=jnp.zeros((batch, n), bool))
    return _choose(s, model.logits(hidden[:, -1]), jax.random.fold_in(key, 0), config)


def _run(graphdef, state, s: _State, key, config: EpisodeConfig) -> _State:
    """Decodes until every row is done or waiting with its last token in the cache."""
    model = nnx.merge(graphdef, state)
    n = config.max_tokens

    def body(s):
        feed = ~s.done & ~s.parked  # a waiting row's stop token still goes into the cache
        hidden, cache = model.decode(s.last_token[:, None], s.position[:, None],
                                     feed[:, None], s.cache)
        s = s.replace(cache=cache, position=s.position + feed.astype(jnp.int32),
                      parked=s.waiting)
        return _choose(s, model.logits(hidden[:, 0]), jax.random.fold_in(key, s.step), config)

    def cond(s):
        return (s.step < n) & jnp.any(~s.done & ~s.parked)

    s = jax.lax.while_loop(cond, body, s)
    # Out of slots: every row still going ends here.
    return s.replace(done=s.done | ((s.step >= n) & ~s.parked))


def _append(graphdef, state, s: _State, chunk, chunk_mask, key, config: EpisodeConfig):
    """Writes an observation chunk [B, O] (left-padded; all padding for rows that get none)
    into the cache and the slots, then samples the next token of the rows it answers."""
    model = nnx.merge(graphdef, state)
    chunk_mask = chunk_mask.astype(bool)
    answered = jnp.any(chunk_mask, -1)
    positions = s.position[:, None] + jnp.maximum(jnp.cumsum(chunk_mask, -1) - 1, 0)
    # The loop's last step chose nothing: its slot (s.step - 1) is empty in the buffers and
    # in the cache, whose next write (cache.index) is that slot. The chunk starts there.
    slot = s.step - 1
    hidden, cache = model.decode(chunk, positions, chunk_mask, s.cache)

    def put(buffer, value):
        return jax.lax.dynamic_update_slice(buffer, value.astype(buffer.dtype), (0, slot))

    s = s.replace(
        step=slot + chunk.shape[1], cache=cache,
        position=s.position + chunk_mask.sum(-1).astype(jnp.int32),
        tokens=put(s.tokens, jnp.where(chunk_mask, chunk, config.sampling.pad_id)),
        observation=put(s.observation, chunk_mask),
        waiting=s.waiting & ~answered, parked=s.parked & ~answered,
        recent=jnp.where(answered[:, None], -1, s.recent))
    return _choose(s, model.logits(hidden[:, -1]), key, config)


_start_jit = jax.jit(_start, static_argnames=("graphdef", "config"))
_run_jit = jax.jit(_run, static_argnames=("graphdef", "config"), donate_argnums=(2,))
_append_jit = jax.jit(_append, static_argnames=("graphdef", "config"), donate_argnums=(2,))


def generate_episodes(graphdef, state, prompts, prompt_mask, key, *, config: EpisodeConfig,
                      tokenizer, observe: Callable[[str], str]) -> EpisodeOutput:
    """Samples multi-turn episodes (module docstring).

    Args:
      graphdef, state: the model (`nnx.split`).
      prompts: [B, P] int32 left-padded; prompt_mask: [B, P] bool.
      key: PRNG key.
      config: EpisodeConfig (static).
      tokenizer: encodes the answers (and decodes each turn's text for `observe`).
      observe: the environment: the text a row generated since its last observation (its
        call included) -> the text appended to its context (e.g. "<result>27</result>").

    Returns:
      EpisodeOutput.
    """
    prompts = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, bool)
    batch = prompts.shape[0]
    width, n = config.max_observation_tokens, config.max_tokens
    turns = np.zeros(batch, np.int32)
    s = _start_jit(graphdef, state, prompts, prompt_mask, key, config=config)
    for turn in range(config.max_turns + 1):
        s = _run_jit(graphdef, state, s, jax.random.fold_in(key, 2 * turn + 1), config=config)
        waiting = np.asarray(s.waiting & ~s.done)
        if not waiting.any():
            break
        if turn == config.max_turns or int(s.step) + width > n:
            s = s.replace(done=s.done | s.waiting)  # no more turns, or no room for one
            break
        chunk, chunk_mask = _answers(s, waiting, tokenizer, observe, width)
        turns += waiting
        s = _append_jit(graphdef, state, s, jnp.asarray(chunk), jnp.asarray(chunk_mask),
                        jax.random.fold_in(key, 2 * turn + 2), config=config)
    return EpisodeOutput(tokens=s.tokens, logp=s.logp, generated=s.generated,
                         observation=s.observation, turns=jnp.asarray(turns),
                         length=jnp.minimum(s.step, n))


def turn_texts(tokens, generated, observation, tokenizer) -> list[str]:
    """Per row, the text generated since its last observation slot (the current turn)."""
    out = []
    for row_tokens, row_generated, row_observation in zip(tokens, generated, observation):
        seen = np.flatnonzero(row_observation)
        start = seen[-1] + 1 if len(seen) else 0
        ids = row_tokens[start:][row_generated[start:]]
        out.append(tokenizer.decode(ids.tolist()))
    return out


def _answers(s: _State, waiting, tokenizer, observe, width: int):
    """The observation chunk [B, O] (left-padded, cut to O tokens) and its mask."""
    tokens, generated, observation = (np.asarray(x) for x in
                                      (s.tokens, s.generated, s.observation))
    texts = turn_texts(tokens, generated, observation, tokenizer)
    chunk = np.zeros((len(texts), width), np.int32)
    mask = np.zeros((len(texts), width), bool)
    for row in np.flatnonzero(waiting):
        ids = list(tokenizer.encode(observe(texts[row])))[:width]
        if ids:
            chunk[row, width - len(ids):] = ids
            mask[row, width - len(ids):] = True
    return chunk, mask


def episode_texts(out: EpisodeOutput, tokenizer) -> list[str]:
    """Each row's completion as text: its generated and observation tokens in order."""
    tokens, valid = np.asarray(out.tokens), np.asarray(out.attention_mask)
    return [tokenizer.decode(row[keep].tolist()) for row, keep in zip(tokens, valid)]


def episode_rows(prompts, prompt_mask, out: EpisodeOutput) -> tuple[np.ndarray, ...]:
    """(tokens [B, P + L], attention_mask [B, P + L], loss_mask [B, L]) of episodes cut to
    the slots written: the teacher-forced layout that reproduces the sampler's context."""
    length = int(out.length)
    tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)[:, :length]], 1)
    attention = np.concatenate([np.asarray(prompt_mask, bool),
                                np.asarray(out.attention_mask)[:, :length]], 1)
    return tokens, attention, np.asarray(out.generated)[:, :length]


__all__: Sequence[str] = ("EpisodeConfig", "EpisodeOutput", "episode_rows", "episode_texts",
                          "generate_episodes", "turn_texts")
