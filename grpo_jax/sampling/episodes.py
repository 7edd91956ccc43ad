"""Multi-turn episodes: the policy generates until it closes a tool call, the environment
answers, and the sampler continues from its KV cache with the answer appended.

    out = generate_episodes(graphdef, state, prompts, prompt_mask, key, config=config,
                            tokenizer=tokenizer, observe=environment)

Each row's completion is a run of slots after its left-padded prompt. A slot holds a token
the policy generated (`generated`: it carries the loss), an observation token the
environment wrote (`observation`: attended to, never in the loss or the KL), or nothing (a
hole, masked out of attention: a row waiting for its answer). A turn ends for a row when its
last generated tokens are `config.stop_ids` (the call's closing tag). The on-device loop
writes one slot per step for every row: the generating rows sample, the rows being answered
write their answer's next token, the waiting rows write nothing. It stops for the host
when a row has waited `config.max_wait_tokens` slots (or nothing else can go on); the host
reads each waiting row's text since its last observation, asks `observe(text)` for the
answer, and hands the answers' tokens to the loop, which writes and decodes them one per
step, beside the rows still generating. No turn re-reads the history: the prompt is
prefilled once and every later token is decoded once, into the cache column of its slot.

The layout keeps teacher forcing exact: a generated token always directly follows the
token it was sampled after (its previous generated token, the answer's last token, or the
prompt's), never a hole, so the trainer's log-probs of `[prompt | slots]` under the
attention mask `prompt_mask | generated | observation` are the sampler's
(`models.completion_logprobs`; tests/test_episodes.py).
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
      max_observation_tokens: O, the longest answer in tokens; a longer one is cut.
      max_wait_tokens: the most slots a row that closed its call waits before the loop
        stops for the host to answer it (fewer: more host round trips; more: more holes).
      sampling: temperature, top_k, top_p, greedy, eos_ids and pad_id as in SamplingConfig
        (max_new_tokens and the budget-forcing fields unused).
    """

    max_tokens: int
    stop_ids: tuple[int, ...]
    max_turns: int = 4
    max_observation_tokens: int = 32
    max_wait_tokens: int = 4
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=1)

    def __post_init__(self):
        if self.max_tokens < 1 or self.max_observation_tokens < 1 or self.max_turns < 0 \
                or self.max_wait_tokens < 0:
            raise ValueError(f"EpisodeConfig: max_tokens and max_observation_tokens must be "
                             f">= 1, max_turns and max_wait_tokens >= 0, got {self}")
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
    last_token: jax.Array  # [B] the token written last
    pending: jax.Array  # [B] last_token is written but not in the cache yet
    position: jax.Array  # [B] the rotary position of the next token decoded
    done: jax.Array  # [B] the episode ended (EOS, out of turns or slots)
    waiting: jax.Array  # [B] the turn ended with the stop sequence; no answer yet
    first_wait: jax.Array  # [] the slot at which a row started waiting, or -1
    recent: jax.Array  # [B, L] the last L generated tokens (L = len(stop_ids))
    queue: jax.Array  # [B, O] the answer being written (left-aligned)
    queue_len: jax.Array  # [B] its length
    queue_pos: jax.Array  # [B] its next token
    cache: KVCache
    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array
    observation: jax.Array


def _write(s: _State, logits, key, config: EpisodeConfig) -> _State:
    """Writes slot s.step: a sampled token for every generating row, the next answer token
    for every row being answered, nothing for the rest."""
    sampling = config.sampling
    feeding = ~s.done & (s.queue_pos < s.queue_len)
    active = ~s.done & ~s.waiting & ~feeding
    scaled = logits if sampling.greedy else logits / sampling.temperature
    if sampling.greedy:
        sampled = _argmax(scaled)
        logp = _logp_at(scaled, sampled)
    else:
        sampled, logp = _filter_and_sample(scaled, key, sampling)
    answer = jnp.take_along_axis(
        s.queue, jnp.minimum(s.queue_pos, s.queue.shape[1] - 1)[:, None], 1)[:, 0]
    token = jnp.where(feeding, answer, sampled)
    written = feeding | active
    eos = (jnp.any(token[:, None] == jnp.asarray(sampling.eos_ids, jnp.int32)[None], -1)
           if sampling.eos_ids else jnp.zeros(token.shape, bool))
    recent = jnp.where(active[:, None],
                       jnp.concatenate([s.recent[:, 1:], token[:, None]], 1), s.recent)
    stop = jnp.all(recent == jnp.asarray(config.stop_ids, jnp.int32)[None], -1)
    starts_waiting = active & ~eos & stop

    def write(buffer, value):
        return jax.lax.dynamic_update_slice(buffer, value.astype(buffer.dtype)[:, None],
                                            (0, s.step))

    return s.replace(
        step=s.step + 1,
        last_token=jnp.where(written, token, s.last_token),
        pending=written,
        done=s.done | (active & eos),
        waiting=s.waiting | starts_waiting,
        first_wait=jnp.where((s.first_wait < 0) & jnp.any(starts_waiting), s.step,
                             s.first_wait),
        recent=recent,
        queue_pos=s.queue_pos + feeding.astype(jnp.int32),
        tokens=write(s.tokens, jnp.where(written, token, sampling.pad_id)),
        logp=write(s.logp, jnp.where(active, logp, 0.0)),
        generated=write(s.generated, active),
        observation=write(s.observation, feeding),
    )


def _start(graphdef, state, prompts, prompt_mask, key, config: EpisodeConfig) -> _State:
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompts.shape
    n, width = config.max_tokens, config.max_observation_tokens
    mask = prompt_mask.astype(bool)
    cache = model.init_cache(batch, prompt_len + n)
    hidden, cache = model.decode(prompts, default_positions(mask), mask, cache)
    s = _State(
        step=jnp.zeros((), jnp.int32), last_token=jnp.zeros((batch,), jnp.int32),
        pending=jnp.zeros((batch,), bool), position=mask.sum(-1).astype(jnp.int32),
        done=jnp.zeros((batch,), bool), waiting=jnp.zeros((batch,), bool),
        first_wait=jnp.full((), -1, jnp.int32),
        recent=jnp.full((batch, len(config.stop_ids)), -1, jnp.int32),
        queue=jnp.zeros((batch, width), jnp.int32), queue_len=jnp.zeros((batch,), jnp.int32),
        queue_pos=jnp.zeros((batch,), jnp.int32), cache=cache,
        tokens=jnp.full((batch, n), config.sampling.pad_id, jnp.int32),
        logp=jnp.zeros((batch, n), jnp.float32), generated=jnp.zeros((batch, n), bool),
        observation=jnp.zeros((batch, n), bool))
    return _write(s, model.logits(hidden[:, -1]), jax.random.fold_in(key, 0), config)


def _run(graphdef, state, s: _State, key, config: EpisodeConfig) -> _State:
    """Decodes and writes slots until they run out, nothing can go on, or a waiting row
    has waited max_wait_tokens slots (the host then answers the waiting rows)."""
    model = nnx.merge(graphdef, state)

    def body(s):
        hidden, cache = model.decode(s.last_token[:, None], s.position[:, None],
                                     s.pending[:, None], s.cache)
        s = s.replace(cache=cache, position=s.position + s.pending.astype(jnp.int32),
                      pending=jnp.zeros_like(s.pending))
        return _write(s, model.logits(hidden[:, 0]), jax.random.fold_in(key, s.step), config)

    def cond(s):
        waiting = jnp.any(s.waiting & ~s.done)
        going = jnp.any(~s.done & ~s.waiting)
        waited = (s.first_wait >= 0) & (s.step - s.first_wait >= config.max_wait_tokens)
        return (s.step < config.max_tokens) & going & ~(waiting & waited)

    return jax.lax.while_loop(cond, body, s)


def _load(s: _State, answers, lengths, answered) -> _State:
    """Hands the answers [B, O] (left-aligned, `lengths` tokens) to the rows `answered`."""
    return s.replace(
        queue=jnp.where(answered[:, None], answers, s.queue),
        queue_len=jnp.where(answered, lengths, s.queue_len),
        queue_pos=jnp.where(answered, 0, s.queue_pos),
        waiting=s.waiting & ~answered,
        recent=jnp.where(answered[:, None], -1, s.recent),
        first_wait=jnp.full((), -1, jnp.int32))


_start_jit = jax.jit(_start, static_argnames=("graphdef", "config"))
_run_jit = jax.jit(_run, static_argnames=("graphdef", "config"), donate_argnums=(2,))
_load_jit = jax.jit(_load, donate_argnums=(0,))


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
      EpisodeOutput. A row that closes a call with no turns left, or with too few slots
      left for the answer and one more token, ends its episode there.
    """
    prompts = jnp.asarray(prompts, jnp.int32)
    prompt_mask = jnp.asarray(prompt_mask, bool)
    batch = prompts.shape[0]
    width, n = config.max_observation_tokens, config.max_tokens
    turns = np.zeros(batch, np.int32)
    s = _start_jit(graphdef, state, prompts, prompt_mask, key, config=config)
    run_key = jax.random.fold_in(key, 1)
    while True:  # each pass answers or ends at least one waiting row
        s = _run_jit(graphdef, state, s, run_key, config=config)
        waiting = np.asarray(s.waiting & ~s.done)
        if not waiting.any():
            break
        answers, lengths = _answers(s, waiting, tokenizer, observe, width)
        room = n - int(s.step)
        answered = waiting & (turns < config.max_turns) & (lengths > 0) & (lengths < room)
        s = s.replace(done=s.done | jnp.asarray(waiting & ~answered))
        if answered.any():
            turns += answered
            s = _load_jit(s, jnp.asarray(answers), jnp.asarray(lengths),
                          jnp.asarray(answered))
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
    """The answers [B, O] of the waiting rows (left-aligned, cut to O tokens) and their
    lengths [B] (0 for the other rows)."""
    tokens, generated, observation = (np.asarray(x) for x in
                                      (s.tokens, s.generated, s.observation))
    texts = turn_texts(tokens, generated, observation, tokenizer)
    answers = np.zeros((len(texts), width), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for row in np.flatnonzero(waiting):
        ids = list(tokenizer.encode(observe(texts[row])))[:width]
        answers[row, :len(ids)] = ids
        lengths[row] = len(ids)
    return answers, lengths


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
