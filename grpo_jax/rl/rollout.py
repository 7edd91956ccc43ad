"""Rollouts: encode prompts into a fixed bucket, sample on device, decode and score.

Shared by the RL stage and the evaluation stage so both compile the same sampler program
when their shapes agree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from grpo_jax import parallel
from grpo_jax.sampling import SamplingConfig, generate
from grpo_jax.sampling.episodes import EpisodeConfig, episode_texts, generate_episodes
from grpo_jax.text import prompt_ids
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


@dataclasses.dataclass
class Rollout:
    """One batch of sampled completions with their scores (host numpy arrays).

    A multi-turn rollout (`episode_rollout`) has tool observations among its completion
    slots: they are in `mask` (attended to) and not in `loss_mask` (never trained on), and
    `turns` / `tool_errors` count each row's answered calls and failed ones.
    """

    prompt_tokens: np.ndarray  # [B, P]
    prompt_mask: np.ndarray  # [B, P]
    tokens: np.ndarray  # [B, N] completion tokens (pad after EOS)
    mask: np.ndarray  # [B, N] completion mask (attention)
    sample_logp: np.ndarray  # [B, N] log-probs under the sampling distribution
    lengths: np.ndarray  # [B] generated tokens
    texts: list[str]
    rewards: np.ndarray  # [B] weighted total
    components: dict[str, np.ndarray]  # name -> [B]
    truncated: np.ndarray  # [B] bool: hit max_new_tokens without EOS
    loss_mask: np.ndarray | None = None  # [B, N] the policy's tokens; None: `mask`
    turns: np.ndarray | None = None  # [B] int32 observations received (multi-turn)
    tool_errors: np.ndarray | None = None  # [B] int32 observations reporting an error

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = np.asarray(self.mask, bool)


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
    return Rollout(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        tokens=tokens,
        mask=mask,
        sample_logp=sample_logp,
        lengths=lengths,
        texts=texts,
        rewards=rewards,
        components=components,
        truncated=truncated,
    )


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
    """
    ids = [getattr(e, "id", None) for e in examples]
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, prompts, prompt_len=prompt_len,
                                                ids=ids)
    out = jax.device_get(generate_episodes(policy.graphdef, policy.state(params),
                                           prompt_tokens, prompt_mask, key, config=config,
                                           tokenizer=tokenizer, observe=environment))
    texts = episode_texts(out, tokenizer)
    rewards, components = score_completions(texts, examples, reward_fns, weights)
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
        mask=generated | observation, sample_logp=np.where(generated, sample_logp, 0.0),
        lengths=generated.sum(1).astype(np.int32), texts=texts, rewards=rewards,
        components=components, truncated=~eos.any(axis=1), loss_mask=generated,
        turns=np.asarray(out.turns, np.int32),
        tool_errors=np.asarray([sum(map(environment.is_error, row)) for row in
                                observation_texts(tokens, observation, tokenizer)], np.int32))


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
    tool_call_rate (episodes with one or more), tool_errors (failed calls per episode), turns
    (generation turns per episode: calls + 1) and observation_frac (the share of the
    completion's tokens the environment wrote)."""
    turns = np.asarray(ro.turns, np.float64)
    observed = (np.asarray(ro.mask, bool) & ~np.asarray(ro.loss_mask, bool)).sum()
    return {"tool_calls": float(turns.mean()), "tool_call_rate": float((turns > 0).mean()),
            "tool_errors": float(np.mean(ro.tool_errors)), "turns": float(turns.mean() + 1),
            "observation_frac": float(observed / max(np.asarray(ro.mask, bool).sum(), 1))}
