"""Rollouts: encode prompts into a fixed bucket, sample on device, decode and score.

Shared by the RL stage and the evaluation stage so both compile the same sampler program
when their shapes agree.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, struct

from grpo_jax import parallel
from grpo_jax.evals.metrics import solved
from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.sampling import SamplingConfig, generate
from grpo_jax.sampling.episodes import EpisodeConfig, episode_texts, generate_episodes
from grpo_jax.text import prompt_ids
from grpo_jax.tools.environment import as_environment
from grpo_jax.tools.guard import guarded_reset
from grpo_jax.training import Params, Policy


def encode_prompts(tokenizer, prompts: Sequence[str], *, prompt_len: int,
                   ids: Sequence[str] | None = None):
    """Left-pads `text.prompt_ids` (BOS + tokens) into [B, prompt_len]; a longer prompt is
    an error.

    Returns (tokens int32 [B, P], mask bool [B, P]).
    """
    tokens = np.full((len(prompts), prompt_len), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(prompts), prompt_len), bool)
    for row, text in enumerate(prompts):
        ids_ = prompt_ids(tokenizer, text)
        if len(ids_) > prompt_len:
            name = ids[row] if ids is not None else f"row {row}"
            raise ValueError(
                f"prompt {name} has {len(ids_)} tokens (with BOS) but the bucket "
                f"task.prompt_len is {prompt_len}; raise task.prompt_len"
            )
        tokens[row, prompt_len - len(ids_):] = ids_
        mask[row, prompt_len - len(ids_):] = True
    return tokens, mask


@struct.dataclass
class Rollout:
    """One batch of B sampled completions of N slots after prompts of P tokens, with their
    scores, in `RolloutBatch`'s vocabulary: a pytree of [B, ...] arrays (host numpy after
    sampling, traced inside the device source's program); the decoded texts ride along
    outside the pytree.

    A multi-turn rollout (`episode_rollout`) has tool observations among its completion
    slots: they are in `attention_mask` (attended to) and not in `loss_mask` (never trained
    on), and `turns` / `tool_errors` count each row's answered calls and failed ones.

    Attributes:
      prompt_tokens, prompt_mask: [B, P] left-padded prompts and their mask.
      tokens: [B, N] int32 completion slots (pad after the end).
      attention_mask: [B, N] bool, the completion slots the model attends to.
      loss_mask: [B, N] bool, the policy's own tokens (inside `attention_mask`).
      behaviour_logp: [B, N] float32 log-probs under the sampling distribution.
      rewards: [B] float32 weighted total.
      components: reward name -> [B] unweighted component.
      lengths: [B] int32 generated tokens.
      truncated: [B] bool, hit max_new_tokens without an end token.
      version: [B] int32 parameter version that sampled each row (the policy after
        `version` updates of its stage), or [B, N] per token (partial rollouts: a row
        continued across updates), stamped by the loop's source; None until then.
      turns, tool_errors: [B] int32 answered calls and failed ones (multi-turn), or None.
      tool_parse_failures: [B] int32 calls that did not parse (multi-turn), or None.
      token_rewards: [B, N] float32, the part of `rewards` a stateful environment gave at
        each token (its turn rewards, weighted), or None.
      texts: the decoded completions (host only, not part of the pytree).
    """

    prompt_tokens: Any
    prompt_mask: Any
    tokens: Any
    attention_mask: Any
    loss_mask: Any
    behaviour_logp: Any
    rewards: Any
    components: dict = struct.field(default_factory=dict)
    lengths: Any = None
    truncated: Any = None
    version: Any = None
    turns: Any = None
    tool_errors: Any = None
    tool_parse_failures: Any = None
    token_rewards: Any = None
    texts: list | None = struct.field(pytree_node=False, default=None)

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def correct(self):
        """[B] bool: the completion counts as solved (pass@1): its accuracy component (the
        total reward without one) reaches 1."""
        return solved(self.components.get("accuracy", self.rewards))

    def to_batch(self) -> RolloutBatch:
        """The learner's batch of this rollout (numpy in, numpy out; traced in, traced out):
        prompt and completion joined, the loss mask kept inside the attention mask, the
        version broadcast to [B], with the `correct` and `truncated` flags."""
        xp = jnp if any(isinstance(x, jax.Array) for x in
                        (self.prompt_tokens, self.tokens, self.attention_mask, self.rewards)) \
            else np
        b, n = np.shape(self.tokens)
        if self.version is None:
            raise ValueError("Rollout.to_batch: the rollout has no version (its source stamps "
                             "the parameter version that sampled it)")
        for name, shape in (("prompt_mask", np.shape(self.prompt_tokens)),
                            ("attention_mask", (b, n)), ("loss_mask", (b, n)),
                            ("behaviour_logp", (b, n)), ("rewards", (b,))):
            if tuple(np.shape(getattr(self, name))) != tuple(shape):
                raise ValueError(f"Rollout.to_batch: {name} has shape "
                                 f"{tuple(np.shape(getattr(self, name)))}, expected "
                                 f"{tuple(shape)}")
        mask = xp.asarray(self.attention_mask, bool)
        # The loss mask inside the attention mask (the same array when they are one).
        loss_mask = mask if self.loss_mask is self.attention_mask else \
            xp.asarray(self.loss_mask, bool) & mask
        return RolloutBatch(
            tokens=xp.concatenate([xp.asarray(self.prompt_tokens), xp.asarray(self.tokens)],
                                  1).astype(xp.int32),
            attention_mask=xp.concatenate([xp.asarray(self.prompt_mask, bool), mask], 1),
            loss_mask=loss_mask,
            behaviour_logp=xp.asarray(self.behaviour_logp, xp.float32),
            rewards=xp.asarray(self.rewards, xp.float32),
            version=(xp.asarray(self.version, xp.int32) if np.ndim(self.version) == 2
                     else xp.broadcast_to(xp.asarray(self.version, xp.int32), (b,))),
            correct=xp.asarray(self.correct, bool),
            truncated=None if self.truncated is None else xp.asarray(self.truncated, bool),
            token_rewards=(None if self.token_rewards is None
                           else xp.asarray(self.token_rewards, xp.float32)),
        )

    def take_rows(self, rows) -> Rollout:
        """The rollout restricted to `rows` (host)."""
        rows = np.asarray(rows, int)
        texts = None if self.texts is None else [self.texts[i] for i in rows]
        return jax.tree.map(lambda x: np.asarray(x)[rows], self).replace(texts=texts)

    @staticmethod
    def concat(parts: Sequence[Rollout]) -> Rollout:
        """The rollouts' rows one after another (host)."""
        texts = None if parts[0].texts is None else [t for p in parts for t in p.texts]
        return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
                            *[p.replace(texts=None) for p in parts]).replace(texts=texts)

    def arrays(self) -> dict:
        """The pytree's arrays by field name (None fields left out): a checkpointable dict
        that `Rollout(**arrays, texts=...)` turns back into the rollout."""
        return {k: v for k, v in serialization.to_state_dict(self).items() if v is not None}


def score_completions(
    texts: Sequence[str],
    examples: Sequence[Any],
    reward_fns: dict[str, Callable[[str, Any], float]],
    weights: dict[str, float],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Weighted sum of named rewards per completion, with each component kept.

    A reward function with a `batched(texts, examples) -> [B]` attribute is called once for
    the whole batch.
    """
    components = {name: np.zeros(len(texts), np.float32) for name in weights}
    for name in weights:
        if name not in reward_fns:
            raise ValueError(
                f"rl.rewards: unknown reward {name!r}; available: {sorted(reward_fns)}"
            )
        fn = reward_fns[name]
        batched = getattr(fn, "batched", None)  # e.g. a learned reward model: one call
        if batched is not None:
            components[name] = np.asarray(batched(list(texts), list(examples)), np.float32)
        else:
            components[name] = np.asarray([fn(t, ex) for t, ex in zip(texts, examples)],
                                          np.float32)
    total = np.zeros(len(texts), np.float32)
    for name, weight in weights.items():
        total += np.float32(weight) * components[name]
    return total, components


def rollout(*args, **kwargs) -> Rollout:
    """Samples one completion per prompt (repeat prompts for groups) and scores it:
    `launch_rollout(...)()` (see there for the arguments)."""
    return launch_rollout(*args, **kwargs)()


def launch_rollout(
    policy: Policy,
    params: Params,
    tokenizer,
    examples: Sequence[Any],
    prompts: Sequence[str],
    key: jax.Array,
    *,
    sampling: SamplingConfig,
    prompt_len: int,
    reward_fns: dict[str, Callable[[str, Any], float]],
    weights: dict[str, float],
    sharding=None,
) -> Callable[[], Rollout]:
    """Starts sampling one completion per prompt and returns `finish() -> Rollout`, which
    waits for the samples, decodes and scores them.

    Between the two the sampler runs asynchronously (JAX's dispatch), so work dispatched in
    between (an update on other devices: `mesh.rollout_devices`) runs beside it.

    With several processes (a multi-controller run), `sharding` (the data sharding of the
    batch rows) says which contiguous block of rows this process holds: it encodes only
    those prompts, the sampler runs on the global batch assembled from every process's
    block, this process decodes and scores its block, and the small per-row results are
    gathered so that every process returns the same whole Rollout. The sampled tokens do
    not depend on the number of processes (jax's random bits do not depend on sharding).
    """
    rows = len(prompts)
    start, stop = (0, rows)
    multi = sharding is not None and jax.process_count() > 1
    if multi:
        start, stop = parallel.process_rows(sharding, rows)
    ids = [getattr(e, "id", None) for e in examples[start:stop]]
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, prompts[start:stop],
                                                prompt_len=prompt_len, ids=ids)
    if multi:
        sampled = generate(policy.graphdef, policy.state(params),
                           parallel.to_global(prompt_tokens, sharding, rows),
                           parallel.to_global(prompt_mask, sharding, rows), key,
                           config=sampling)
    else:
        sampled = generate(policy.graphdef, policy.state(params), prompt_tokens, prompt_mask,
                           key, config=sampling)

    def finish() -> Rollout:
        return _finish_rollout(sampled, multi, tokenizer, examples[start:stop], prompt_tokens,
                               prompt_mask, sampling=sampling, reward_fns=reward_fns,
                               weights=weights, rows=rows)

    return finish


def _finish_rollout(sampled, multi, tokenizer, examples, prompt_tokens, prompt_mask, *,
                    sampling, reward_fns, weights, rows) -> Rollout:
    out = jax.tree.map(parallel.local_rows, sampled) if multi else jax.device_get(sampled)
    tokens = np.asarray(out.tokens)
    mask = np.asarray(out.mask, bool)
    lengths = np.asarray(out.lengths)
    texts = [tokenizer.decode(tokens[i, : lengths[i]].tolist()) for i in range(len(tokens))]
    rewards, components = score_completions(texts, examples, reward_fns, weights)
    sample_logp = np.asarray(out.logp, np.float32)
    if multi:  # every process gets the whole batch (small host arrays)
        gather = parallel.allgather_rows
        prompt_tokens, prompt_mask = gather(prompt_tokens), gather(prompt_mask)
        tokens, mask, lengths = gather(tokens), gather(mask), gather(lengths)
        sample_logp, rewards = gather(sample_logp), gather(rewards)
        components = {name: gather(value) for name, value in components.items()}
        texts = parallel.allgather_strings(texts)
    bad = np.flatnonzero(~np.isfinite(np.where(mask, sample_logp, 0.0)).all(axis=1))
    if len(bad):
        raise FloatingPointError(
            f"sampler: non-finite logits in {len(bad)} of {rows} rows (first: row "
            f"{bad[0]}); the policy's parameters or inputs are not finite")
    eos = np.isin(tokens, np.asarray(sampling.eos_ids)) & mask
    truncated = ~eos.any(axis=1)
    return Rollout(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
                   attention_mask=mask, loss_mask=mask, behaviour_logp=sample_logp,
                   rewards=rewards, components=components, lengths=lengths,
                   truncated=truncated, texts=texts)


# The reward component of a stateful environment's own rewards (summed over the turns).
ENVIRONMENT_REWARD = "environment"


def episode_rollout(policy: Policy, params: Params, tokenizer, examples: Sequence[Any],
                    prompts: Sequence[str], key: jax.Array, *, config: EpisodeConfig,
                    environment, prompt_len: int,
                    reward_fns: dict[str, Callable[[str, Any], float]],
                    weights: dict[str, float]) -> Rollout:
    """Samples one multi-turn episode per prompt (`sampling.generate_episodes` with
    `environment` answering the calls) and scores its whole text, observations included.

    The completion slots keep their layout (generated tokens, observations, holes), so the
    learner's teacher-forced pass over `[prompt | tokens]` under `[prompt_mask | mask]`
    reproduces the sampler's log-probs; `loss_mask` is the generated tokens.

    The environment (an `Environment`, or what `tools.environment.as_environment` takes)
    starts each episode with `reset(example)` (its observation appended to the prompt;
    none, with no state, by default), through `tools.guard.guarded_reset`: a reset that
    fails starts its episode with no observation, every call of it answered with the
    error, and counts one in the row's `tool_errors`. With the reward name "environment"
    in `weights`, the sum of its turns' rewards is that component (weighted like the
    others).
    """
    weights = dict(weights)
    environment_weight = weights.pop(ENVIRONMENT_REWARD, None)
    environment = as_environment(environment)
    started = [guarded_reset(environment, example) for example in examples]
    prompts = [prompt + start.observation for prompt, start in zip(prompts, started)]
    states = [start.state for start in started]
    reset_failures = np.asarray([start.failed for start in started], np.int32)
    ids = [getattr(e, "id", None) for e in examples]
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, prompts, prompt_len=prompt_len,
                                                ids=ids)
    out = jax.device_get(generate_episodes(policy.graphdef, policy.state(params),
                                           prompt_tokens, prompt_mask, key, config=config,
                                           tokenizer=tokenizer, observe=environment,
                                           states=states))
    texts = episode_texts(out, tokenizer)
    rewards, components = score_completions(texts, examples, reward_fns, weights)
    token_rewards = None
    if environment_weight is not None:
        turn_rewards = np.asarray(out.turn_rewards, np.float32)
        components[ENVIRONMENT_REWARD] = turn_rewards.sum(1)
        token_rewards = np.float32(environment_weight) * turn_rewards
        rewards = rewards + token_rewards.sum(1)
    generated = np.asarray(out.generated, bool)
    observation = np.asarray(out.observation, bool)
    tokens, sample_logp = np.asarray(out.tokens), np.asarray(out.logp, np.float32)
    bad = np.flatnonzero(~np.isfinite(np.where(generated, sample_logp, 0.0)).all(axis=1))
    if len(bad):
        raise FloatingPointError(
            f"sampler: non-finite logits in {len(bad)} of {len(prompts)} rows (first: row "
            f"{bad[0]}); the policy's parameters or inputs are not finite")
    eos = np.isin(tokens, np.asarray(config.sampling.eos_ids)) & generated
    return Rollout(
        prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
        attention_mask=generated | observation, loss_mask=generated,
        behaviour_logp=np.where(generated, sample_logp, 0.0), rewards=rewards,
        components=components, lengths=generated.sum(1).astype(np.int32),
        truncated=~eos.any(axis=1), texts=texts,
        turns=np.asarray(out.turns, np.int32),
        tool_errors=np.asarray(out.tool_errors, np.int32) + reset_failures,
        tool_parse_failures=np.asarray(out.parse_failures, np.int32),
        token_rewards=token_rewards)


def observation_texts(tokens, observation, tokenizer) -> list[list[str]]:
    """Per row, the text of each observation (each run of observation slots), in order."""
    out = []
    for row_tokens, row_observation in zip(np.asarray(tokens), np.asarray(observation, bool)):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row_observation.astype(np.int8),
                                                       [0]])))
        out.append([tokenizer.decode(row_tokens[start:stop].tolist())
                    for start, stop in zip(edges[::2], edges[1::2])])
    return out


def tool_record(ro: Rollout) -> dict[str, float]:
    """The multi-turn half of a metrics line: tool_calls (answered calls per episode),
    tool_call_rate (episodes with one or more), tool_errors (failed calls per episode),
    tool_parse_failures (calls that did not parse, per episode), turns (generation turns per
    episode: calls + 1) and observation_frac (the share of the completion's tokens the
    environment wrote)."""
    turns = np.asarray(ro.turns, np.float64)
    observed = (np.asarray(ro.attention_mask, bool) & ~np.asarray(ro.loss_mask, bool)).sum()
    return {"tool_calls": float(turns.mean()), "tool_call_rate": float((turns > 0).mean()),
            "tool_errors": float(np.mean(ro.tool_errors)), "turns": float(turns.mean() + 1),
            "tool_parse_failures": float(np.mean(ro.tool_parse_failures))
            if ro.tool_parse_failures is not None else 0.0,
            "observation_frac": float(observed / max(np.asarray(ro.attention_mask, bool).sum(),
                                                     1))}
