"""Rollout collection shared by the RL stage kinds, evaluation and rejection sampling."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from grpo_jax import parallel
from grpo_jax.rewards import overlong_penalty
from grpo_jax.rl.rollout import Rollout, episode_rollout
from grpo_jax.rl.rollout import launch_rollout as _launch_rollout
from grpo_jax.runner.guards import NonFiniteError
from grpo_jax.runner.rewards import LENGTH_REWARDS
from grpo_jax.runner.toolkit import prompt_text
from grpo_jax.sampling import SamplingConfig
from grpo_jax.sampling.episodes import EpisodeConfig
from grpo_jax.tools import ToolEnvironment, render_observation


def rollout(*args, where: str, **kwargs) -> Rollout:
    """`grpo_jax.rl.rollout.rollout`; non-finite logits in the sampler (parameters that are
    finite but too large for the forward pass, e.g. after a learning rate far too high)
    are a NonFiniteError naming `where`, one line: a rerun stops at the same place again
    rather than training on garbage."""
    return launch_rollout(*args, where=where, **kwargs)()


def launch_rollout(*args, where: str, **kwargs):
    """`grpo_jax.rl.rollout.launch_rollout` with `rollout`'s error: finish() -> Rollout."""
    return _sampler_errors(_launch_rollout(*args, **kwargs), where)


def _sampler_errors(finish, where: str):
    """finish() with the sampler's FloatingPointError turned into `rollout`'s error."""

    def finished() -> Rollout:
        try:
            return finish()
        except FloatingPointError as err:
            rows = re.search(r"in \d+ of \d+ rows", str(err))
            raise NonFiniteError(
                f"{where}: the sampler's logits are not finite"
                f"{' ' + rows.group(0) if rows else ''} although the parameters are finite: "
                "they are too large for the forward pass (a learning rate far too high?); "
                "nothing more was trained or saved, and the same command stops here "
                "again") from None

    return finished


def tool_episodes(run, section, sampling: SamplingConfig
                  ) -> tuple[EpisodeConfig, ToolEnvironment] | None:
    """The multi-turn settings of a section with `tools` set (the static EpisodeConfig and
    the environment that answers the calls), or None for single-turn sampling.

    With task.template=chat and a checkpoint whose chat template has a tool role, the
    observations are written as that template writes a tool's message.
    """
    name = section.get("tools", "")
    if not name:
        return None
    renderer = None
    if run.config.task.template == "chat" and hasattr(run.tokenizer, "tool_response_renderer"):
        renderer = run.tokenizer.tool_response_renderer()
    environment = ToolEnvironment(tool=name, render=renderer or render_observation)
    config = EpisodeConfig(max_tokens=sampling.max_new_tokens,
                           stop_ids=tuple(run.tokenizer.encode(environment.stop_text)),
                           max_turns=section.max_turns,
                           max_observation_tokens=section.max_observation_tokens,
                           max_wait_tokens=section.max_wait_tokens, sampling=sampling)
    return config, environment


def sample_batch(run, policy, params, examples, key, *, sampling, reward_fns, weights, where,
                 episodes: tuple | None = None, sharding=None):
    """`launch_rollout` (or, with `episodes` = `tool_episodes(...)`, a multi-turn
    `episode_rollout`) of one batch:
    finish() -> Rollout. An episode's turns need the host between them, so it runs in
    finish()."""
    prompts = [prompt_text(run, ex) for ex in examples]
    if episodes is None:
        return launch_rollout(policy, params, run.tokenizer, examples, prompts, key,
                              sampling=sampling, prompt_len=run.config.task.prompt_len,
                              reward_fns=reward_fns, weights=weights, sharding=sharding,
                              where=where)
    if jax.process_count() > 1:
        raise NotImplementedError(f"{where}: multi-turn episodes (tools) run in one process; "
                                  "set tools to '' for a multi-process run")

    def finish():
        return episode_rollout(policy, params, run.tokenizer, examples, prompts, key,
                               config=episodes[0], environment=episodes[1],
                               prompt_len=run.config.task.prompt_len, reward_fns=reward_fns,
                               weights=weights)

    return _sampler_errors(finish, where)


def sample_and_score(run, examples, *, num_samples: int, batch_size: int, sampling, key,
                     weights=None, policy=None, params=None, episodes=None):
    """Samples `num_samples` completions per example in fixed-size batches with the run's
    policy (or `policy`, `params`), multi-turn with `episodes` (`tool_episodes`); one dict
    per sample (example, text, length, components, reward, and turns and tool_errors for
    episodes)."""
    policy = run.policy if policy is None else policy
    params = run.params if params is None else params
    flat = [ex for ex in examples for _ in range(num_samples)]
    reward_fns = run.task.reward_fns()
    weights = weights or {name: 1.0 for name in reward_fns}
    records = []
    for start in range(0, len(flat), batch_size):
        chunk = flat[start:start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[0]] * (batch_size - real)  # static shape: pad with copies
        ro = sample_batch(run, policy, params, chunk, jax.random.fold_in(key, start),
                          sampling=sampling, reward_fns=reward_fns, weights=weights,
                          where="sampling", episodes=episodes, sharding=run.data_sharding)()
        for i in range(real):
            records.append({
                "example": chunk[i],
                "text": ro.texts[i],
                "length": int(ro.lengths[i]),
                "components": {k: float(v[i]) for k, v in ro.components.items()},
                "reward": float(ro.rewards[i]),
                **({"turns": int(ro.turns[i]), "tool_errors": int(ro.tool_errors[i])}
                   if ro.turns is not None else {}),
            })
    return records


def _combine_rollouts(parts, take):
    """A Rollout whose every field is `take` (a function of the parts' field values)."""
    out = {}
    for field in dataclasses.fields(parts[0]):
        values = [getattr(p, field.name) for p in parts]
        if values[0] is None:  # an optional field the rollouts do not have
            out[field.name] = None
        elif field.name == "components":
            out[field.name] = {k: take([v[k] for v in values]) for k in values[0]}
        elif field.name == "texts":
            out[field.name] = list(take([np.asarray(v, dtype=object) for v in values]))
        else:
            out[field.name] = take(values)
    return type(parts[0])(**out)


def concat_rollouts(parts):
    """Concatenates Rollouts row-wise."""
    return _combine_rollouts(parts, np.concatenate)


def take_rows(ro, rows):
    """The Rollout restricted to `rows`."""
    rows = np.asarray(rows, int)
    return _combine_rollouts([ro], lambda values: values[0][rows])


def collect_rollout(run, stage, iterator, step: int, *, sampling, weights, reward_fns,
                    dynamic: bool, overlong_cache: int = 0) -> tuple[Rollout, list, dict]:
    """`launch_collect(...)()`: one batch of N groups of G scored completions."""
    return launch_collect(run, stage, iterator, step, sampling=sampling, weights=weights,
                          reward_fns=reward_fns, dynamic=dynamic,
                          overlong_cache=overlong_cache)()


def launch_collect(run, stage, iterator, step: int, *, sampling, weights, reward_fns,
                   dynamic: bool, overlong_cache: int = 0):
    """One batch of N groups of G scored completions (N = num_prompts, G = group_size).

    With `overlong_cache` > 0 the soft overlong punishment (DAPO) is added to the rewards as
    the component "overlong". With `dynamic` sampling (DAPO), groups whose rewards are all
    equal (zero advantage, no gradient) are dropped and more prompts are sampled, for at most
    `max_sampling_rounds` rounds; if the batch is still short, the remaining groups are
    filled with fully masked rows (they carry no loss) so the update keeps its compiled shape.

    `weights` are the section's reward weights; "overlong" among them weights the overlong
    punishment (1.0 if absent).

    Returns finish() -> (rollout, examples, info dict). Without dynamic sampling the
    sampler runs between the two calls (the prompts are drawn and the sampling started
    here); dynamic sampling needs each round's rewards to go on, so it runs here whole.
    """
    section = stage.section
    n, g = section.num_prompts, section.group_size
    text_weights = {k: v for k, v in weights.items() if k not in LENGTH_REWARDS}
    kept, kept_examples, rounds, dropped = [], [], 0, 0
    policy, params = run.sampler()  # the run's, or its copy on mesh.rollout_devices
    episodes = tool_episodes(run, section, sampling)

    def launch(batch_examples, rounds):
        key = jax.random.fold_in(run.stage_key(stage.index, step), rounds)
        if policy is not run.policy:  # the key, like the parameters, to the rollout devices
            key = jax.device_put(key, parallel.replicated_sharding(run.rollout_mesh))
        finish = sample_batch(
            run, policy, params, batch_examples, key, sampling=sampling,
            reward_fns=reward_fns, weights=text_weights, where=f"{stage.name} step {step + 1}",
            episodes=episodes,
            sharding=run.data_sharding if policy is run.policy else None)

        def finished():
            ro = finish()
            if overlong_cache > 0:
                penalty = overlong_penalty(ro.lengths, max_length=section.max_new_tokens,
                                           cache_length=overlong_cache)
                ro.components["overlong"] = penalty
                ro.rewards = ro.rewards + np.float32(weights.get("overlong", 1.0)) * penalty
            return ro

        return finished

    if not dynamic:
        batch_examples = [ex for ex in next(iterator) for _ in range(g)]
        finish = launch(batch_examples, 0)
        return lambda: (finish(), batch_examples, {"sampling_rounds": 1})
    while True:
        batch_examples = [ex for ex in next(iterator) for _ in range(g)]
        ro = launch(batch_examples, rounds)()
        rounds += 1
        groups = ro.rewards.reshape(n, g)
        good = np.flatnonzero(groups.std(axis=1) > 0)
        dropped += n - len(good)
        have = sum(len(k.rewards) for k in kept) // g
        good = good[: n - have]
        if len(good):
            rows = (good[:, None] * g + np.arange(g)[None]).reshape(-1)
            kept.append(take_rows(ro, rows))
            kept_examples.extend(batch_examples[i] for i in rows)
        have += len(good)
        if have == n or rounds >= section.max_sampling_rounds:
            break
    filled = n - have
    if filled:
        # Masked filler rows: copies of the last batch's first rows with no loss mask.
        filler = take_rows(ro, np.arange(filled * g))
        filler.mask = np.zeros_like(filler.mask)
        filler.loss_mask = np.zeros_like(filler.loss_mask)
        filler.rewards = np.zeros_like(filler.rewards)
        kept.append(filler)
        kept_examples.extend(batch_examples[: filled * g])
    merged = concat_rollouts(kept) if len(kept) > 1 else kept[0]
    result = merged, kept_examples, {"sampling_rounds": rounds, "dropped_groups": dropped,
                                     "filled_groups": filled}
    return lambda: result
