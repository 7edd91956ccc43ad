"""Resolving reward names of a config section to reward functions.

A name in `<section>.rewards` is looked up, in order, among the task's own rewards
(`task.reward_fns()`), the registered reward sources (rewards built from the run, such as a
learned reward model), and grpo_jax.rewards' built-ins (e.g. "language"). "overlong" is not
a function of the text: the RL stage applies it to token lengths.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

RewardFn = Callable[[str, Any], float]
# name -> factory(run, section) -> reward fn
REWARD_SOURCES: dict[str, Callable[[Any, Any], RewardFn]] = {}
LENGTH_REWARDS = ("overlong",)


def register_reward_source(name: str):
    """Decorator: a reward usable in `<section>.rewards` built from the run and section."""

    def wrap(factory):
        REWARD_SOURCES[name] = factory
        return factory

    return wrap


def resolve_reward_fns(run, names: Iterable[str], *, section=None) -> dict[str, RewardFn]:
    """name -> fn(completion, example) for each name (length rewards are skipped)."""
    from grpo_jax import rewards as rewards_lib

    task_fns = run.task.reward_fns()
    kind = section.get("kind", "rl") if section is not None else "rl"
    fns = {}
    for name in names:
        if name in LENGTH_REWARDS:
            continue
        if name in task_fns:
            fns[name] = task_fns[name]
        elif name in REWARD_SOURCES:
            fns[name] = REWARD_SOURCES[name](run, section)
        else:
            try:
                fns[name] = rewards_lib.get_reward_fn(name)
            except ValueError:
                raise ValueError(
                    f"{kind}.rewards: unknown reward {name!r}; task rewards: {sorted(task_fns)}, "
                    f"sources: {sorted(REWARD_SOURCES)}, built-ins: language, overlong"
                ) from None
    return fns
