"""Stage kinds: what a config section's `kind` field names.

A `StageKind` bundles everything the pipeline needs to know about one kind of stage: the
function that runs it, the config section it expects (with every field and its default),
the validation of such a section, whether its metrics are RL curves for the report, and the
reward sources it provides to other sections (e.g. the learned reward model).

This module imports nothing of grpo_jax: `grpo_jax.stages` builds the registry from its
modules, and the runner receives it as an argument, so the imports run one way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Mapping

# run(run: runner.Run, stage: runner.StageSpec) -> None
StageRunner = Callable[[Any, Any], None]
# validate(check: runner.checks.SectionCheck) -> None; raises ConfigError via `check`
SectionValidator = Callable[[Any], None]
# factory(run, section) -> reward fn (completion, example) -> float
RewardSource = Callable[[Any, Any], Callable[[str, Any], float]]


@dataclasses.dataclass(frozen=True)
class StageKind:
    """One kind of stage.

    Attributes:
      name: the value of a section's `kind` field.
      run: runs one stage of this kind: `run(run, stage)`; trains / evaluates `run.params`
        and ends with `run.finish_stage(stage, ...)`.
      default_section: a fresh `ml_collections.ConfigDict` with every field of the kind,
        each commented; configs start from it and validation compares against it.
      validate: checks one section before any stage runs (see `SectionCheck`).
      rl_curves: its metrics are RL curves (reward_mean, pass@1, kl_ref, ...) for the report.
      reward_sources: rewards this kind makes available to other sections' `rewards`, by name.
      description: one line for `--print_config` and error messages.
      summary: section -> one line that `--print_config` adds for each stage of this kind
        (e.g. the rl kind's algorithm with its resolved hyper-parameters), or None.
      lora: the kind runs with LoRA parameters (model.lora_rank > 0: `run.params` is a
        {"base", "lora"} tree whose adapters alone are trained); validation refuses a LoRA
        run with a stage of a kind without it.
      groups: the shared field groups its section has (`runner.fields.FieldGroup`: loop,
        sampling, off-policy, tools); validation runs their checks before `validate`.
    """

    name: str
    run: StageRunner
    default_section: Callable[[], Any]
    validate: SectionValidator | None = None
    rl_curves: bool = False
    reward_sources: Mapping[str, RewardSource] = dataclasses.field(default_factory=dict)
    description: str = ""
    summary: Callable[[Any], str] | None = None
    lora: bool = False
    groups: tuple = ()


class Registry(Mapping[str, StageKind]):
    """An immutable name -> StageKind mapping (duplicate names are an error)."""

    def __init__(self, kinds: Iterable[StageKind]):
        self._kinds: dict[str, StageKind] = {}
        for kind in kinds:
            if kind.name in self._kinds:
                raise ValueError(f"stage kind {kind.name!r} is registered twice")
            self._kinds[kind.name] = kind

    def __getitem__(self, name: str) -> StageKind:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def reward_sources(self) -> dict[str, RewardSource]:
        """Every kind's reward sources, by reward name."""
        sources: dict[str, RewardSource] = {}
        for kind in self._kinds.values():
            sources.update(kind.reward_sources)
        return sources

    def rl_kinds(self) -> tuple[str, ...]:
        return tuple(name for name, kind in self._kinds.items() if kind.rl_curves)
