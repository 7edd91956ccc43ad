"""Sampling one scored batch, shared by the RL loop's host source, evaluation and rejection
sampling."""

from __future__ import annotations

import re

import jax

from grpo_jax.rl.rollout import Rollout, episode_rollout, launch_rollout
from grpo_jax.runner.guards import NonFiniteError
from grpo_jax.runner.rewards import resolve_reward_fns
from grpo_jax.runner.toolkit import prompt_text
from grpo_jax.sampling import SamplingConfig
from grpo_jax.sampling.episodes import EpisodeConfig
from grpo_jax.tools import Environment, make_environment, render_observation


def _sampler_errors(finish, where: str):
    """finish() with the sampler's FloatingPointError turned into a NonFiniteError naming
    `where`, one line: non-finite logits in the sampler with finite parameters (too large for
    the forward pass, e.g. after a learning rate far too high) stop a rerun at the same
    place again rather than training on garbage."""

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
                  ) -> tuple[EpisodeConfig, Environment] | None:
    """The multi-turn settings of `section`'s tools group (a section with the group, or the
    loop's `LoopSettings`): the static EpisodeConfig and the environment that answers the
    calls, or None for single-turn sampling (tools "").

    With task.template=chat and a checkpoint whose chat template has a tool role, the
    observations are written as that template writes a tool's message.
    """
    name = section.tools
    if not name:
        return None
    renderer = None
    if run.config.task.template == "chat" and hasattr(run.tokenizer, "tool_response_renderer"):
        renderer = run.tokenizer.tool_response_renderer()
    environment = make_environment(name, render=renderer or render_observation)
    config = EpisodeConfig(max_tokens=sampling.max_new_tokens,
                           stop_ids=tuple(run.tokenizer.encode(environment.stop_text)),
                           max_turns=section.max_turns,
                           max_observation_tokens=section.max_observation_tokens,
                           max_wait_tokens=section.max_wait_tokens, sampling=sampling)
    return config, environment


def sample_batch(run, policy, params, examples, key, *, sampling, reward_fns, weights, where,
                 episodes: tuple | None = None, sharding=None):
    """`rl.rollout.launch_rollout` (or, with `episodes` = `tool_episodes(...)`, a
    multi-turn `episode_rollout`) of one batch: finish() -> Rollout, the sampler's errors
    named after `where`. An episode's turns need the host between them, so it runs in
    finish()."""
    # JSON tool calls describe their tools to the model through a chat template (`tools=`)
    schemas = episodes[1].schemas if episodes is not None else None
    prompts = [prompt_text(run, ex, tools=schemas) for ex in examples]
    if episodes is None:
        return _sampler_errors(launch_rollout(
            policy, params, run.tokenizer, examples, prompts, key, sampling=sampling,
            prompt_len=run.config.task.prompt_len, reward_fns=reward_fns, weights=weights,
            sharding=sharding), where)
    if jax.process_count() > 1:
        raise NotImplementedError(f"{where}: multi-turn episodes (tools) run in one process; "
                                  "set tools to '' for a multi-process run")

    def finish():
        return episode_rollout(policy, params, run.tokenizer, examples, prompts, key,
                               config=episodes[0], environment=episodes[1],
                               prompt_len=run.config.task.prompt_len, reward_fns=reward_fns,
                               weights=weights)

    return _sampler_errors(finish, where)


def fixed_batches(run, policy, params, examples, key, *, batch_size: int, sampling,
                  reward_fns, weights, episodes=None, sharding=None, where: str = "sampling"):
    """`examples` (one row each) sampled and scored in batches of `batch_size` rows
    (`sample_batch`), one static shape: the last batch is padded with copies of its first
    row. The batch from row `start` draws with jax.random.fold_in(key, start). Yields
    (the batch's examples, its real rows, its Rollout), the padding rows last."""
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[0]] * (batch_size - real)  # static shape: pad with copies
        yield chunk, real, sample_batch(run, policy, params, chunk,
                                        jax.random.fold_in(key, start), sampling=sampling,
                                        reward_fns=reward_fns, weights=weights, where=where,
                                        episodes=episodes, sharding=sharding)()


def sample_and_score(run, examples, *, num_samples: int, batch_size: int, sampling, key,
                     weights=None, policy=None, params=None, episodes=None):
    """Samples `num_samples` completions per example in fixed-size batches with the run's
    policy (or `policy`, `params`), multi-turn with `episodes` (`tool_episodes`); one dict
    per sample (example, text, length, components, reward, and turns and tool_errors for
    episodes). `weights`: reward name -> weight of `reward` (the task's rewards are
    components whatever the weights; None: each of them weighted 1)."""
    policy = run.policy if policy is None else policy
    params = run.params if params is None else params
    flat = [ex for ex in examples for _ in range(num_samples)]
    reward_fns = dict(run.task.reward_fns())
    if weights is None:
        weights = {name: 1.0 for name in reward_fns}
    else:  # the task's rewards are always scored (as components), weighted 0 unless named
        reward_fns.update(resolve_reward_fns(run, [n for n in weights if n not in reward_fns]))
        weights = {**{name: 0.0 for name in reward_fns},
                   **{name: w for name, w in weights.items() if name in reward_fns}}
    records = []
    for chunk, real, ro in fixed_batches(run, policy, params, flat, key, batch_size=batch_size,
                                         sampling=sampling, reward_fns=reward_fns,
                                         weights=weights, episodes=episodes,
                                         sharding=run.data_sharding):
        for i in range(real):
            records.append({
                "example": chunk[i],
                "text": ro.texts[i],
                "length": int(ro.lengths[i]),
                "components": {k: float(v[i]) for k, v in ro.components.items()},
                "reward": float(ro.rewards[i]),
                **({"turns": int(ro.turns[i]), "tool_errors": int(ro.tool_errors[i]),
                    "tool_parse_failures": int(ro.tool_parse_failures[i])}
                   if ro.turns is not None else {}),
            })
    return records
