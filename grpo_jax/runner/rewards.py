"""Reward names of a config section -> reward functions.

A name in `<section>.rewards` is a "module:function" reference to a plain Python function
(`grpo_jax.rewards.python`), or is looked up, in order, among the task's own rewards
(`task.reward_fns()`), the reward sources of the run's stage kinds (e.g. "reward_model",
provided by the reward_model kind), sources registered in code with
`register_reward_source`, and grpo_jax.rewards' built-ins ("random" and "incorrect", the
spurious rewards of `grpo_jax.rewards.spurious`, among them). "overlong" is not a function of
the text: the RL loop applies it to token lengths (DAPO's soft overlong punishment).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from grpo_jax import rewards as rewards_lib
from grpo_jax.rewards import spurious
from grpo_jax.rewards.python import (DEFAULT_BUDGET_SECONDS, is_python_reward,
                                     load_python_reward)

RewardFn = Callable[[str, Any], float]
# Sources registered in code: name -> factory(run, section) -> reward fn.
REWARD_SOURCES: dict[str, Callable[[Any, Any], RewardFn]] = {}
LENGTH_REWARDS = ("overlong",)
# The sum of a stateful environment's turn rewards (`rl.rollout.episode_rollout`), not a
# function of the text.
ENVIRONMENT_REWARDS = ("environment",)
BUILTIN_REWARDS = ("accuracy", "format", "format_soft", "language", "countdown",
                   "countdown_tinyzero")


def register_reward_source(name: str):
    """Decorator: a reward usable in `<section>.rewards` built from the run and section."""

    def wrap(factory):
        REWARD_SOURCES[name] = factory
        return factory

    return wrap


def _random(run, section) -> RewardFn:
    """"random": a coin flip per (problem, completion), seeded by the run's seed."""
    del section
    return spurious.random_reward(seed=int(run.config.seed))


def _incorrect(run, section) -> RewardFn:
    """"incorrect": 1 - the task's accuracy (the built-in one for a task without its own)."""
    del section
    accuracy = run.task.reward_fns().get("accuracy") or rewards_lib.get_reward_fn("accuracy")
    return spurious.incorrect_reward(accuracy)


# Rewards with no information about correctness (Shao et al. 2025's spurious rewards).
SPURIOUS = {"random": _random, "incorrect": _incorrect}


def _sources(kinds) -> dict[str, Callable[[Any, Any], RewardFn]]:
    return {**SPURIOUS, **(kinds.reward_sources() if kinds is not None else {}),
            **REWARD_SOURCES}


def available_rewards(task, kinds) -> list[str]:
    """Every reward name a section may use with this task and these stage kinds."""
    names = set(task.reward_fns()) | set(_sources(kinds)) | set(BUILTIN_REWARDS)
    return sorted(names | set(LENGTH_REWARDS) | set(ENVIRONMENT_REWARDS))


def python_reward_budget(config) -> float:
    """The seconds per completion a Python reward's call may take before it is counted as
    slow: config.python_rewards.budget_seconds (the default without that section)."""
    section = config.get("python_rewards")
    return DEFAULT_BUDGET_SECONDS if section is None else section.budget_seconds


def resolve_reward_fns(run, names: Iterable[str], *, section=None) -> dict[str, RewardFn]:
    """name -> fn(completion, example) for each name (length rewards are skipped).

    A function may carry a `batched(completions, examples) -> np.ndarray` attribute (the
    learned reward model does); `grpo_jax.rl.rollout.score_completions` then scores a whole
    rollout in one call.
    """
    task_fns = run.task.reward_fns()
    sources = _sources(getattr(run, "kinds", None))
    fns = {}
    for name in names:
        if name in LENGTH_REWARDS or name in ENVIRONMENT_REWARDS:
            continue
        if is_python_reward(name):
            fns[name] = load_python_reward(
                name, budget_seconds=python_reward_budget(run.config))
        elif name in task_fns:
            fns[name] = task_fns[name]
        elif name in sources:
            fns[name] = sources[name](run, section)
        elif name in BUILTIN_REWARDS:
            fns[name] = rewards_lib.get_reward_fn(name)
        else:
            stage = section.get("kind", "rl") if section is not None else "rl"
            raise ValueError(f"{stage}.rewards: unknown reward {name!r}; available: "
                             f"{available_rewards(run.task, getattr(run, 'kinds', None))}")
    return fns
