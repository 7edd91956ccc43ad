"""What the analyses read from finished runs (each `RunRecord.results`, a
`grpo_jax.results.FinishedRun`): a run's figures and rows, the arms' per-seed values, the
base and constant pseudo-arms, and a finished run's policy for post-hoc measurements."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from grpo_jax.results import FinishedRun
from grpo_jax.stats import paired_interval
from grpo_jax.studies.record import RunRecord, StudyRuns


def arm_curves(runs: StudyRuns, arms: Sequence[str]) -> dict[str, list[list[dict]]]:
    """{arm: the training rows of each of its finished runs} (`curve_panels`' input)."""
    return {name: [training_rows(r) for r in runs.arm(name) if r.finished] for name in arms}


def training_mean(rows: Sequence[dict], name: str, skip: int = 0) -> float | None:
    """The mean of the finite values of `name` over the training rows after the first
    `skip` (e.g. 1: the step that compiled), or None without any."""
    values = [r[name] for r in rows[skip:] if r.get(name) is not None
              and math.isfinite(r[name])]
    return sum(values) / len(values) if values else None


def training_means(record: RunRecord, names: Sequence[str], skip: int = 0) -> dict:
    """{name: `training_mean` of it over the run's training rows} for each of `names`."""
    rows = training_rows(record)
    return {name: training_mean(rows, name, skip) for name in names}


def figures(record: RunRecord) -> dict:
    """A finished run's final evaluation figures and its last RL step's train/ values
    (`FinishedRun.final_figures`)."""
    return record.results.final_figures()


def training_rows(record: RunRecord) -> list[dict]:
    """The RL steps of a run's metrics.jsonl, in run order (`FinishedRun.training_rows`)."""
    return record.results.training_rows()


def last_stage_rows(record: RunRecord) -> dict[str, dict]:
    """{stage name: its last metrics row} (an eval stage's held-out figures;
    `FinishedRun.stage_rows`)."""
    return record.results.stage_rows()


class ArmRows:
    """Arms built one (base, seed) row at a time: `add(name, base, seed, values)`, then
    `arms(order)`: {name: {"seeds", "bases", "metrics": {metric: one value per row, None
    where a row lacks it}}}, in `order` (None: in the order the names were first added);
    a name never added is left out."""

    def __init__(self):
        self._entries: dict[str, dict] = {}

    def add(self, name: str, base: str, seed: int, values: Mapping) -> None:
        entry = self._entries.setdefault(name, {"seeds": [], "bases": [], "rows": []})
        entry["seeds"].append(seed)
        entry["bases"].append(base)
        entry["rows"].append(dict(values))

    def arms(self, order: Sequence[str] | None = None) -> dict:
        names = list(self._entries) if order is None else [n for n in order
                                                           if n in self._entries]
        out = {}
        for name in names:
            entry = self._entries[name]
            metrics = sorted({k for row in entry["rows"] for k in row})
            out[name] = {"seeds": list(entry["seeds"]), "bases": list(entry["bases"]),
                         "metrics": {k: [row.get(k) for row in entry["rows"]]
                                     for k in metrics}}
        return out


def per_seed(runs: StudyRuns, values: Callable[[RunRecord], Mapping[str, float]],
             arms: Sequence[str] | None = None, rename: Callable[[str], str] | None = None
             ) -> dict:
    """{arm: {"seeds", "bases", "metrics": {metric: per-seed values}}} over the finished runs,
    `values(run)` giving a run's metrics; `rename` maps an arm's run name to its summary
    name."""
    rows = ArmRows()
    for record in runs.runs:
        if not record.finished or (arms is not None and record.arm not in arms):
            continue
        name = rename(record.arm) if rename else record.arm
        rows.add(name, record.base, record.seed, values(record))
    return rows.arms()


def per_arm(runs: StudyRuns, values: Callable[[RunRecord], Mapping[str, float]],
            names: Sequence[str]) -> dict:
    """`per_seed` of the arms `names`, in that order (an arm without a finished run left
    out)."""
    arms = per_seed(runs, values)
    return {name: arms[name] for name in names if name in arms}


def measured_arm(records: Sequence[RunRecord], metrics: dict) -> dict:
    """An arm of per-run measurements: `metrics` ({metric: one value per record, in order})
    with the records' seeds and bases."""
    return {"seeds": [r.seed for r in records], "bases": [r.base for r in records],
            "metrics": metrics}


def paired(arms: Mapping, a: str, b: str, metric: str) -> dict:
    """The interval of arm a's `metric` minus arm b's over the (base, seed) pairs both
    have (`paired_interval`; descriptive, outside the contrasts)."""
    left, right = arms[a], arms[b]
    ref = dict(zip(zip(right["bases"], right["seeds"]), right["metrics"].get(metric, [])))
    return paired_interval(left["metrics"].get(metric, []),
                           [ref.get(k) for k in zip(left["bases"], left["seeds"])])


def eval_values(record: RunRecord, metrics: Sequence[str], final: str = "eval_final",
                before: str = "eval_base") -> dict:
    """A run's held-out figures: `metrics` of its last `final` evaluation, and of its
    `before` evaluation as "base_<metric>" (`FinishedRun.eval_values`)."""
    return record.results.eval_values(metrics, final, before)


def add_base_arm(arms: dict, source: str, metrics: Sequence[str], name: str = "base") -> None:
    """Adds the arm `name`: the base model, from `source`'s "base_<metric>" values (each run's
    evaluation before training: every arm of a (base, seed) starts from the same
    parameters, so one arm's runs give the base's figures paired by (base, seed))."""
    if source not in arms:
        return
    entry = arms[source]
    arms[name] = {"seeds": list(entry["seeds"]), "bases": list(entry["bases"]),
                  "metrics": {m: list(entry["metrics"].get(f"base_{m}",
                                                          [None] * len(entry["seeds"])))
                              for m in metrics}}


def constant_arm(arms: dict, like: str, name: str, metric: str, value: float) -> None:
    """Adds to the pseudo-arm `name` (made if new) `value` of `metric` for each (base, seed)
    of `like`: a contrast against it tests a run's value against a fixed bar."""
    if like in arms:
        n = len(arms[like]["seeds"])
        entry = arms.setdefault(name, {"seeds": list(arms[like]["seeds"]),
                                       "bases": list(arms[like]["bases"]), "metrics": {}})
        entry["metrics"][metric] = [value] * n


def load_finished(workdir: str):
    """A finished run's config, task, tokenizer, policy and final parameters
    (`FinishedRun.policy`), for the studies that measure a trained model after the fact."""
    return FinishedRun(workdir).policy


def load_run_params(workdir: str, tokenizer):
    """A run's final parameters as a plain dict (its latest checkpoint), built with
    `tokenizer` (`FinishedRun.params_with`)."""
    return FinishedRun(workdir).params_with(tokenizer)


def eval_seed(config) -> int:
    """The held-out problems' seed of a run's config (`runner.inputs.eval_seed`)."""
    from grpo_jax.runner.inputs import eval_seed as seed_of
    return seed_of(config)
