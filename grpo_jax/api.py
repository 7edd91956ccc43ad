"""The Python entry point, for scripts and notebooks: config -> run -> result.

    from grpo_jax import api

    config = api.config("smoke")            # the main job's config (configs/default.py)
    api.config("ppo:smoke")                 # any job by name, with a preset (JOBS)
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

__all__ = ["ConfigError", "JOBS", "Result", "config", "load", "train"]

JOBS = tuple(config_presets.JOBS)  # the job names, as --config=NAME[:preset] takes them


def config(name: str | None = None, *, job: str | None = None) -> ml_collections.ConfigDict:
    """A job's config to edit before `train`, named as `--config=` names it.

    `name` is "JOB[:preset]" for a job of `JOBS` (main: configs/default.py, ppo, trpo,
    r1_pipeline, tools, agents, code, gsm8k; "ppo:smoke"), or a preset of the main job
    ("smoke": seconds; "cpu"), or None (the main job at its own sizes). `job` names the job
    apart ("smoke" with job="tools"). An unknown job or preset raises ValueError in one line.
    """
    preset = name
    if job is None:
        head, colon, rest = (name or "").partition(":")
        if colon or head in config_presets.JOBS:
            job, preset = head, rest or None
        elif name not in (None, "") + config_presets.JOBS["main"].presets:
            raise ValueError(f"api.config: {name!r} is neither a job ({', '.join(JOBS)}) "
                             "nor a preset of the main job (cpu, smoke)")
    job = job or "main"
    if job not in config_presets.JOBS:
        raise ValueError(f"api.config: {config_presets.unknown_job(job)}")
    return config_presets.job_config(job, preset)


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
