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

import ml_collections

from grpo_jax import config_presets, storage
from grpo_jax.results import FinishedRun
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


Result = FinishedRun  # a run's directory and what it wrote (`grpo_jax.results`)


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
    """The `Result` of a finished run (its report.json, eval rows and metrics)."""
    workdir = storage.normalize(workdir)
    if not storage.isfile(storage.join(workdir, "report.json")):
        raise FileNotFoundError(f"{workdir}: no report.json (not a finished run; "
                                "api.train(config, workdir) runs or resumes it)")
    return Result(workdir)
