"""The reasoning-gym task families a study runs beside arithmetic, as roles of its base set.

A study whose question is about reasoning in general (not the arithmetic task) runs its arms
on arithmetic and on `SECOND`, a reasoning-gym family (grpo_jax/tasks/reasoning_gym.py,
configs/reasoning_gym_tasks.py's presets). Its base set holds the main base as role "base"
and the family's base as role `role(family)`; an arm on the family holds that role's name in
`model.init_from` until `attach` sets the role's directory, and is named `arm_name(family,
arm)` so that its contrasts stay within the family. A family base is the preset's
pretraining, so every study (and replication) that uses a family shares its base runs.

`SECOND` is `spell_backward`: its preset's base is far from its coverage ceiling (pass@1 0.10,
pass@8 0.55 in docs/reasoning_gym.md's Results, where `letter_counting`'s base has pass@8
0.93), so pass@k at large k, the reasoning boundary, can move on it.
"""

from __future__ import annotations

FAMILIES = ("letter_counting", "spell_backward")
SECOND = "spell_backward"
MAIN_ROLE = "base"


def role(family: str, name: str = "base") -> str:
    """A family's role in a base set: "<family>:<name>"."""
    return f"{family}:{name}"


def arm_name(family: str, arm: str) -> str:
    """An arm on a family: "<family>: <arm>"."""
    return f"{family}: {arm}"


def job(tier: str, family: str):
    """The family's preset (full tier), or the smoke preset's sizes on the family's dataset
    (mini tier)."""
    # imported when a config is built, so `list` stays light
    from grpo_jax import config_presets

    if family not in FAMILIES:
        raise ValueError(f"task family {family!r}; expected one of {', '.join(FAMILIES)}")
    config = config_presets.reasoning_gym_job(family if tier == "full" else "smoke")
    config.task.kwargs.datasets = family
    return config


def base(tier: str, family: str, model: str = "tiny-1m"):
    """The preset's pretraining of `model` (another model than tiny-1m: then its held-out
    evaluation too, as distill_vs_rl's student)."""
    config = job(tier, family)
    config.stages = "pretrain" if model == "tiny-1m" else "pretrain,eval_base"
    config.model.name = model
    return config


def grpo(tier: str, family: str, name: str = "base", stages: str = "eval_base,rl,eval_final",
         model: str | None = None):
    """The preset's GRPO stage from the family's role `name` (model.init_from holds the
    role until `attach`); `model` for a role of another size than the preset's."""
    config = job(tier, family)
    del config.pretrain
    config.stages = stages
    config.model.init_from = role(family, name)
    if model is not None:
        config.model.name = model
    return config


def with_family(main, tier: str, family: str = SECOND) -> dict:
    """A base set: the main base (a config) as role "base" and the family's base."""
    return {MAIN_ROLE: main, role(family): base(tier, family)}


def attach(config, base_set: dict) -> None:
    """The run starts from the role `model.init_from` names ("" or a directory-less name:
    the main base)."""
    roles = base_set["roles"]
    config.model.init_from = roles[config.model.init_from or MAIN_ROLE]
