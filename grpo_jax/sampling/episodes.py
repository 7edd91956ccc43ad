"""Multi-turn episodes: the policy generates until it closes a tool call, the environment
answers, and the sampler continues from its KV cache with the answer appended.

    out = generate_episodes(graphdef, state, prompts, prompt_mask, key, config=config,
                            tokenizer=tokenizer, observe=environment)

Each row's completion is a run of columns after its left-padded prompt. A column holds a token
the policy generated (`generated`: it carries the loss), an observation token the
environment wrote (`observation`: attended to, never in the loss or the KL), or nothing (a
hole, masked out of attention: a row waiting for its answer). A turn ends for a row when its
last generated tokens are `config.stop_ids` (the call's closing tag). The decode core
(`sampling.decode`) writes one column per step for every row: the generating rows sample, the
rows being answered write their answer's next token, the waiting rows write nothing. It
stops for the host when a row has waited `config.max_wait_tokens` steps (or nothing else
can go on; `decode.paused`); the host reads each waiting row's text since its last
observation, asks `observe(text)` for the answer, and hands the answers' tokens to the
loop's queue (`decode.hand_off`), which writes and decodes them one per step, beside the
rows still generating. No turn re-reads the history: the prompt is prefilled once per
prompt group and every later token is decoded once, into the cache at its column; the
cache grows in `sampling.cache_phases` phases (the host grows it between runs).

With `sampling.slots` S < B (continuous batching, `decode.DecodeSpec.continuous`) the rows
take S slots in turn: an episode that ends frees its slot for the next row, one waiting for
its answer keeps it and writes nothing, so the layout has no holes and a row's columns
depend on its own key, index, parameters and answers only (the same for any S). The two
layouts do not draw alike: with slots every column is drawn with `key`, with every row at
once column 0 is drawn with `key` and the later ones with fold_in(key, 1), so sampled
(not greedy) episodes differ between the layouts.

The layout keeps teacher forcing exact: a generated token always directly follows the
token it was sampled after (its previous generated token, the answer's last token, or the
prompt's), never a hole, so the trainer's log-probs of `[prompt | columns]` under the
attention mask `prompt_mask | generated | observation` are the sampler's
(`models.completion_logprobs`; tests/test_episodes.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.sampling import decode
from grpo_jax.sampling.config import SamplingConfig
from grpo_jax.sampling.decode import DecodeSpec, DecodeState
from grpo_jax.sampling.sampler import checked_prompts
from grpo_jax.tools.environment import as_environment
from grpo_jax.tools.guard import guarded_step, judge


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Static settings of multi-turn sampling (hashable).

    Attributes:
      max_tokens: N, the completion's columns: generated and observation tokens and holes.
      stop_ids: the token ids that end a turn (a tool call's closing tag).
      max_turns: the most observations an episode gets; a row that ends turn max_turns + 1
        with a call ends its episode there.
      max_observation_tokens: O, the longest answer in tokens; a longer one is cut.
      max_wait_tokens: the most steps a row that closed its call waits before the loop
        stops for the host to answer it (fewer: more host round trips; more: more holes).
      sampling: token choice, eos_ids, pad_id, budget forcing (its forced tokens share the
        queue with the answers), cache_phases (over the N columns) and prompt_group as in
        SamplingConfig (its max_new_tokens unused).
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
      tokens: [B, N] int32 columns (pad where nothing was written).
      logp: [B, N] float32, the sampler's log-probs of the generated tokens (0 elsewhere).
      generated: [B, N] bool, the policy's tokens (the loss mask).
      observation: [B, N] bool, the environment's tokens.
      turns: [B] int32, observations each row received.
      length: [] int32, the columns written (the rest of the N are empty).
      tool_errors: [B] int32, the answers the environment called errors (its `is_error`)
        and the calls that failed (`tools.guard`: an exception, no answer within the
        deadline, an answer too long or malformed; counted even where no answer could
        follow).
      forced: [B, N] bool, the generated tokens budget forcing wrote.
      turn_rewards: [B, N] float32, each turn's reward (a stateful environment's `step`)
        on the turn's last generated token; zeros elsewhere.
      parse_failures: [B] int32, the turns whose call did not parse (the environment's
        `is_parse_failure`; answered with an error observation, never dropped).
      ended_by_environment: [B] bool, the environment ended the episode (its `done`).
    """

    tokens: jax.Array
    logp: jax.Array
    generated: jax.Array
    observation: jax.Array
    turns: jax.Array
    length: jax.Array
    tool_errors: jax.Array
    forced: jax.Array
    turn_rewards: jax.Array
    ended_by_environment: jax.Array
    parse_failures: jax.Array

    @property
    def attention_mask(self) -> jax.Array:
        """[B, N] bool: the columns the model attends to."""
        return self.generated | self.observation


def _spec(config: EpisodeConfig, continuous: bool = False) -> DecodeSpec:
    return DecodeSpec(sampling=config.sampling, columns=config.max_tokens,
                      stop_ids=config.stop_ids, max_wait_tokens=config.max_wait_tokens,
                      answer_width=config.max_observation_tokens, continuous=continuous)


def _start(graphdef, weights, prompts, prompt_mask, key, spec: DecodeSpec) -> DecodeState:
    return decode.prefill(nnx.merge(graphdef, weights), prompts, prompt_mask, key, spec)


def _start_slots(graphdef, weights, prompts, prompt_mask, spec: DecodeSpec,
                 slots: int) -> DecodeState:
    return decode.start_slots(nnx.merge(graphdef, weights), prompts, prompt_mask, spec, slots)


def _run(graphdef, weights, s: DecodeState, key, spec: DecodeSpec, end: int) -> DecodeState:
    return decode.run(nnx.merge(graphdef, weights), s, key, spec, end)


def _grow(graphdef, weights, s: DecodeState, size: int) -> DecodeState:
    return decode.grow(nnx.merge(graphdef, weights), s, size)


_weights_jit = jax.jit(decode.rollout_state, static_argnames=("graphdef",))
_start_jit = jax.jit(_start, static_argnames=("graphdef", "spec"))
_start_slots_jit = jax.jit(_start_slots, static_argnames=("graphdef", "spec", "slots"))
_run_jit = jax.jit(_run, static_argnames=("graphdef", "spec", "end"), donate_argnums=(2,))
_grow_jit = jax.jit(_grow, static_argnames=("graphdef", "size"))
_hand_off_jit = jax.jit(decode.hand_off, donate_argnums=(0,))
_paused_jit = jax.jit(decode.paused, static_argnames=("spec",))
_at_edge_jit = jax.jit(decode.at_edge)


def generate_episodes(graphdef, state, prompts, prompt_mask, key, *, config: EpisodeConfig,
                      tokenizer, observe, states: Sequence | None = None) -> EpisodeOutput:
    """Samples multi-turn episodes (module docstring).

    Args:
      graphdef, state: the model (`nnx.split`).
      prompts: [B, P] int32 left-padded; prompt_mask: [B, P] bool; rows in contiguous
        groups of config.sampling.prompt_group share one prompt.
      key: PRNG key.
      config: EpisodeConfig (static).
      tokenizer: encodes the answers (and decodes each turn's text for `observe`).
      observe: the environment: a `tools.Environment` (`step(state, turn_text) ->
        (observation, reward, done, state)`), or a function of the text a row generated
        since its last observation (its call included) -> the text appended to its context
        (e.g. "<result>27</result>"; no reward, never done), taken as an Environment by
        `tools.environment.as_environment`. The answers its `is_error(observation)` calls
        errors are counted in `tool_errors`.
        Every call goes through `tools.guard.guarded_step`: a call that raises, hangs past
        the environment's `call_seconds` or answers out of bounds is answered with an
        error observation and counted in `tool_errors`; the run goes on.
      states: each row's episode state (`Environment.reset`), for an Environment; None:
        None for every row.

    Returns:
      EpisodeOutput. A row that closes a call with no turns left, or with too few columns
      left for the answer and one more token, ends its episode there.
    """
    if not isinstance(config, EpisodeConfig):
        raise ValueError(f"generate_episodes: config must be an EpisodeConfig, got "
                         f"{type(config).__name__}")
    prompts, prompt_mask = checked_prompts(prompts, prompt_mask, config.sampling.prompt_group,
                                           "generate_episodes")
    batch, prompt_len = prompts.shape
    continuous = 0 < config.sampling.slots < batch
    spec = _spec(config, continuous)
    n, ends = config.max_tokens, spec.phase_ends
    environment = as_environment(observe)

    def step(state, text):  # every call through the guard: it can neither raise nor hang
        return guarded_step(environment, state, text)

    states = [None] * batch if states is None else list(states)
    if len(states) != batch:
        raise ValueError(f"generate_episodes: {len(states)} states for {batch} rows")
    turns = np.zeros(batch, np.int32)
    tool_errors = np.zeros(batch, np.int32)
    parse_failures = np.zeros(batch, np.int32)
    turn_rewards = np.zeros((batch, n), np.float32)
    env_done = np.zeros(batch, bool)
    weights = _weights_jit(graphdef, state)
    if continuous:  # the core over config.sampling.slots slots; one key for every column
        s = _start_slots_jit(graphdef, weights, prompts, prompt_mask, spec=spec,
                             slots=config.sampling.slots)
        run_key = key
    else:
        s = _start_jit(graphdef, weights, prompts, prompt_mask, key, spec=spec)
        run_key = jax.random.fold_in(key, 1)
    phase = 0
    while True:  # each pause answers or ends every waiting row; each phase ends once
        s = _run_jit(graphdef, weights, s, run_key, spec=spec, end=ends[phase])
        if bool(_paused_jit(s, spec=spec)):
            slots = _Slots(s, batch, n) if continuous else None
            waiting = slots.waiting if continuous else np.asarray(s.waiting & ~s.done)
            answers, lengths, errors, failed, done, broke = _answers(
                s, waiting, tokenizer, step, states, turn_rewards,
                (environment.is_error, environment.is_parse_failure), environment.render,
                spec.queue_width, config.max_observation_tokens, environment.parallel_steps)
            parse_failures += waiting & failed
            env_done |= done
            room = slots.room if continuous else n - int(s.step)
            answered = waiting & ~done & (turns < config.max_turns) & (lengths > 0) \
                & (lengths < room)
            turns += answered
            tool_errors += (answered & errors) | (waiting & broke)
            handed = (answers, lengths, answered, waiting & ~answered)
            if continuous:  # by row -> by the slot holding the row
                handed = tuple(slots.of_rows(x) for x in handed)
            s = _hand_off_jit(s, *map(jnp.asarray, handed))
        elif phase + 1 < len(ends) and (
                bool(_at_edge_jit(s)) if continuous
                else int(s.step) >= ends[phase] and bool(jnp.any(~s.done))):
            phase += 1
            s = _grow_jit(graphdef, weights, s, size=prompt_len + ends[phase])
        else:
            break
    if continuous:  # no holes: the columns written are those of the longest row
        written = np.asarray(s.generated | s.observation).any(0)
        length = jnp.asarray(int(np.flatnonzero(written)[-1]) + 1 if written.any() else 0)
    else:
        length = jnp.minimum(s.step, n)
    return EpisodeOutput(tokens=s.tokens, logp=s.logp, generated=s.generated,
                         observation=s.observation, turns=jnp.asarray(turns),
                         length=length, tool_errors=jnp.asarray(tool_errors),
                         forced=s.forced, turn_rewards=jnp.asarray(turn_rewards),
                         ended_by_environment=jnp.asarray(env_done),
                         parse_failures=jnp.asarray(parse_failures))


class _Slots:
    """A paused continuous state read by row: which rows wait for the host, the columns
    each has left, and by-row arrays put back by slot for `decode.hand_off`."""

    def __init__(self, s: DecodeState, batch: int, n: int):
        self.rows = np.asarray(s.row_ids)
        self.live = self.rows < batch
        held = self.rows[self.live]
        self.waiting = np.zeros(batch, bool)
        self.waiting[held] = np.asarray(s.waiting & ~s.done)[self.live]
        self.room = np.zeros(batch, np.int64)
        self.room[held] = n - np.asarray(s.t)[self.live]
        self.batch = batch

    def of_rows(self, values: np.ndarray) -> np.ndarray:
        """[R, ...] by row -> [S, ...] by slot (zero / False for an empty slot)."""
        out = values[np.minimum(self.rows, self.batch - 1)]
        keep = self.live.reshape((-1,) + (1,) * (out.ndim - 1))
        return np.where(keep, out, np.zeros_like(out))


def turn_texts(tokens, generated, observation, tokenizer) -> list[str]:
    """Per row, the text generated since its last observation column (the current turn)."""
    out = []
    for row_tokens, row_generated, row_observation in zip(tokens, generated, observation):
        seen = np.flatnonzero(row_observation)
        start = seen[-1] + 1 if len(seen) else 0
        ids = row_tokens[start:][row_generated[start:]]
        out.append(tokenizer.decode(ids.tolist()))
    return out


def answer_ids(text: str, tokenizer, width: int, render=None) -> list[int]:
    """An answer's token ids, at most `width`. A longer one rendered by `render` (the
    environment's wrapper, e.g. "<result>" ... "</result>") is cut inside, on a token
    boundary, and keeps its closing text; otherwise its first `width` tokens."""
    ids = list(tokenizer.encode(text))
    if len(ids) <= width or render is None:
        return ids[:width]
    try:  # the environment's render: one that fails here only loses the careful cut
        before, after = render("\x00").split("\x00", 1)
    except Exception:  # noqa: BLE001
        return ids[:width]
    if not (text.startswith(before) and text.endswith(after)) or \
            len(text) < len(before) + len(after):
        return ids[:width]
    head, tail = list(tokenizer.encode(before)), list(tokenizer.encode(after))
    room = width - len(head) - len(tail)
    if room < 1:
        return ids[:width]
    inner = text[len(before):len(text) - len(after)]
    return head + list(tokenizer.encode(inner))[:room] + tail


def _answers(s: DecodeState, waiting, tokenizer, step, states: list, turn_rewards, judges,
             render, queue_width: int, width: int, parallel: int = 1):
    """The environment's answers to the waiting rows (`step(state, turn text)` ->
    `tools.guard.Answer`); each row's state advanced in `states`, its turn's reward added to
    `turn_rewards` on its last generated token. `parallel` > 1: that many rows' steps run at
    once, in threads (each row's answer depends only on its state and text, so the results
    do not change).

    Returns:
      (answers [B, Q] int32 left-aligned, cut to `width` tokens (`answer_ids`); lengths [B]
      int32, 0 for the other rows; errors [B] bool, `is_error` of each answer's text (or it
      raised); failed [B] bool, `is_parse_failure` of it; done [B] bool, the environment
      ended the row's episode; broke [B] bool, the call failed (`tools.guard`)).
    """
    is_error, is_parse_failure = judges
    tokens, generated, observation = (np.asarray(x) for x in
                                      (s.tokens, s.generated, s.observation))
    texts = turn_texts(tokens, generated, observation, tokenizer)
    answers = np.zeros((len(texts), queue_width), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    errors = np.zeros(len(texts), bool)
    failed = np.zeros(len(texts), bool)
    done = np.zeros(len(texts), bool)
    broke = np.zeros(len(texts), bool)
    rows = np.flatnonzero(waiting)
    if parallel > 1 and len(rows) > 1:  # e.g. sandbox processes: their waits overlap
        with concurrent.futures.ThreadPoolExecutor(min(parallel, len(rows))) as pool:
            results = list(pool.map(lambda r: step(states[r], texts[r]), rows))
    else:
        results = [step(states[r], texts[r]) for r in rows]
    for row, (text, reward, done[row], states[row], broke[row]) in zip(rows, results):
        last = np.flatnonzero(generated[row])
        if len(last):
            turn_rewards[row, last[-1]] += np.float32(reward)
        failed[row] = bool(judge(is_parse_failure, text))
        if done[row]:
            continue
        ids = answer_ids(text, tokenizer, width, render)
        answers[row, :len(ids)] = ids
        lengths[row] = len(ids)
        errors[row] = judge(is_error, text) is not False
    return answers, lengths, errors, failed, done, broke


def episode_texts(out: EpisodeOutput, tokenizer) -> list[str]:
    """Each row's completion as text: its generated and observation tokens in order."""
    tokens, valid = np.asarray(out.tokens), np.asarray(out.attention_mask)
    return [tokenizer.decode(row[keep].tolist()) for row, keep in zip(tokens, valid)]


def episode_rows(prompts, prompt_mask, out: EpisodeOutput) -> tuple[np.ndarray, ...]:
    """(tokens [B, P + L], attention_mask [B, P + L], loss_mask [B, L]) of episodes cut to
    the columns written: the teacher-forced layout that reproduces the sampler's context."""
    length = int(out.length)
    tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)[:, :length]], 1)
    attention = np.concatenate([np.asarray(prompt_mask, bool),
                                np.asarray(out.attention_mask)[:, :length]], 1)
    return tokens, attention, np.asarray(out.generated)[:, :length]


__all__: Sequence[str] = ("EpisodeConfig", "EpisodeOutput", "episode_rows", "episode_texts",
                          "generate_episodes", "turn_texts")
