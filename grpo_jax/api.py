"""The Python entry point, for scripts and notebooks: config -> run -> result.

    from grpo_jax import api

    config = api.config("smoke")            # the main job's config (configs/default.py)
    config.rl.beta = 0.0
    result = api.train(config, "runs/nb")   # every stage; the same call resumes
    result.evals["eval_final"]["pass@1"]    # the held-out figures of each eval stage
    result.metrics("rl")[-1]["reward_mean"] # metrics.jsonl's rows of one stage

It is the command line's run (`python -m grpo_jax.main`) without the flags: the same
validation (a bad field raises `ConfigError` naming it, before anything is written), the same
workdir (checkpoints, metrics.jsonl, report.md), the same resume.
"""

from __future__ import annotations

import dataclasses
import json

import ml_collections

from grpo_jax import config_presets, storage
from grpo_jax.metrics import read_metrics
from grpo_jax.runner.checks import ConfigError

__all__ = ["ConfigError", "Result", "config", "load", "train"]

_JOBS = {"main": config_presets.main_job, "tools": config_presets.tool_job}


def config(preset: str | None = None, *, job: str = "main") -> ml_collections.ConfigDict:
    """A job's config to edit before `train`: "main" (configs/default.py: pretrain, GRPO,
    held-out evaluations) or "tools" (configs/tools.py: episodes with a calculator), with a
    preset ("smoke": seconds; None: the job's own sizes)."""
    if job not in _JOBS:
        raise ValueError(f"api.config: job {job!r}; expected one of {sorted(_JOBS)}")
    return _JOBS[job](preset)


@dataclasses.dataclass(frozen=True)
class Result:
    """A run's directory and what it wrote. `evals`: {eval stage: its held-out figures}."""
    workdir: str
    evals: dict

    def metrics(self, stage: str | None = None) -> list[dict]:
        """metrics.jsonl's rows, of one stage when `stage` is given."""
        rows = read_metrics(self.workdir)
        return [r for r in rows if stage is None or r.get("stage") == stage]

    def report(self) -> dict:
        """report.json: the figures per column, the labels, the code's provenance."""
        return json.loads(storage.read_text(storage.join(self.workdir, "report.json")))

    @property
    def report_path(self) -> str:
        """report.md, the human-readable report (tables and plots)."""
        return storage.join(self.workdir, "report.md")


def train(config: ml_collections.ConfigDict, workdir: str) -> Result:
    """Runs every stage of `config.stages` in `workdir` (resuming what is there) and returns
    its `Result`. Raises ConfigError for a bad config and ValueError for a workdir that
    cannot hold the run (empty, a file, not writable), before anything is written."""
    from grpo_jax.pipeline import train_and_evaluate  # jax and the stages only when run
    from grpo_jax.runner.checks import workdir_problem

    problem = workdir_problem(workdir)
    if problem:
        raise ValueError(f"api.train: workdir: {problem}; expected a directory this process "
                         "can write (existing, or created when missing)")
    train_and_evaluate(config, workdir)
    return load(workdir)


def load(workdir: str) -> Result:
    """The `Result` of a finished run (its report.json and eval rows)."""
    workdir = storage.normalize(workdir)
    if not storage.isfile(storage.join(workdir, "report.json")):
        raise FileNotFoundError(f"{workdir}: no report.json (not a finished run; "
                                "api.train(config, workdir) runs or resumes it)")
    recorded = json.loads(storage.read_text(storage.join(workdir, "config.json")))
    names = [n.strip() for n in recorded["stages"].split(",") if n.strip()]
    kinds = {n: recorded[n].get("kind") for n in names}
    evals = {}
    for row in read_metrics(workdir):  # an eval stage's row: its figures (the last one)
        if kinds.get(row.get("stage")) == "eval":
            evals[row["stage"]] = {k: v for k, v in row.items()
                                   if k not in ("stage", "step", "wall_time")}
    return Result(workdir=workdir, evals=evals)
