"""A study as data: its record (`Study`, each `Tier`), its claims (`Claim`), its runs'
records (`RunRecord`, `StudyRuns`) and what its analysis returns (`Analysis`); the study
author's face is `grpo_jax.studies.common`, which re-exports these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from grpo_jax.results import FinishedRun
from grpo_jax.studies import summary as summary_lib

Claim = summary_lib.Claim
# A claim's note when its margin was set after its first runs (the rule needs one).
POST_HOC_MARGIN = "margin set after the first runs"


@dataclasses.dataclass(frozen=True)
class Tier:
    """One size of a study. `cost`: the wall time it takes on the 2-core CPU (measured or
    estimated, said which). `arms`: the arms this tier runs (None: all)."""
    bases: tuple[int, ...]
    seeds: tuple[int, ...]
    cost: str
    arms: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One finished (or planned) run of an arm: its labels, its planned config and its
    directory's contents (`results`, a `grpo_jax.results.FinishedRun`)."""
    arm: str
    base: str  # the base's key ("" without a base)
    seed: int
    workdir: str  # <workdir>/runs/<config hash>: shared by every study asking for the run
    config: Any  # the run's ConfigDict
    link: str = ""  # <workdir>/<study>/runs/<arm>/<base>,seed=<s>: a link to `workdir`
    results: FinishedRun = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "results", FinishedRun(self.workdir))

    @property
    def finished(self) -> bool:
        return self.results.finished


@dataclasses.dataclass
class StudyRuns:
    """A study's runs in one workdir: `runs` in arm order, then base, then seed."""
    study: Study
    tier: str
    root: str  # <workdir>/<study>
    runs: list[RunRecord]
    bases: dict[str, dict]  # key -> {"seed", "config_hash", "workdir"}

    def arm(self, name: str) -> list[RunRecord]:
        return [r for r in self.runs if r.arm == name]


@dataclasses.dataclass
class Analysis:
    """What a study's analysis returns. `arms`: {arm: {"seeds", "bases", "metrics": {metric:
    per-seed values}}} (`per_seed` builds it); `specs`: the contrasts (a, b, metric), one
    family for Holm's adjustment; `table`: the study's own markdown table(s); `plots`:
    writes the study's figures into a directory; `protocol`: fields that differ from what
    the configs say (`protocol_of`)."""
    arms: dict
    specs: list[tuple[str, str, str]]
    table: str = ""
    extra: dict = dataclasses.field(default_factory=dict)
    protocol: dict = dataclasses.field(default_factory=dict)
    plots: Callable[[str], None] | None = None
    scales: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Study:
    """A study as data. `arms`: every arm's name (`arm_configs(tier)` builds their configs;
    a tier may run a subset)."""
    name: str
    question: str
    tiers: Mapping[str, Tier]
    arms: tuple[str, ...]
    arm_configs: Callable[[str], dict]
    analyze: Callable[[StudyRuns], Analysis]
    base_config: Callable[[str], Any] | None = None
    measure: Callable[[StudyRuns], None] | None = None
    attach: Callable[[Any, dict], None] | None = None
    claims: tuple[summary_lib.Claim, ...] = ()
