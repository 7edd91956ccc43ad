"""A finished run: what a run directory holds, read one way by the API, sweeps and studies.

    run = FinishedRun("runs/nb")
    run.finished                           # report.json was written
    run.evals["eval_final"]["pass@1"]      # each eval stage's held-out figures
    run.stage_rows()["rl"]                 # each stage's last metrics row
    run.training_rows()[-1]["kl_ref"]      # the RL steps of metrics.jsonl
    run.policy.params                      # its final policy, built when first asked

`api.Result` is this class; `sweep.Run` and the studies' `RunRecord` hold one (`.results`)
beside their labels (arm, seed, base). Reading files needs only json and numpy (a sweep
process never imports jax); the policy is built by the runner's own builders, imported when
it is asked for.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from grpo_jax import storage
from grpo_jax.metrics import read_metrics

__all__ = ["FINAL_TRAINING", "FinishedRun", "TrainedPolicy"]

FINAL_TRAINING = ("reward_mean", "kl_ref", "completion_length")  # last RL step's values
HISTORY_FIELD = "_history"  # config.json's earlier configs (runner.run_directory's field)


class TrainedPolicy(NamedTuple):
    """A finished run's final policy with what it was trained on (`FinishedRun.policy`)."""
    config: Any  # ml_collections.ConfigDict
    task: Any
    tokenizer: Any
    policy: Any  # training.Policy
    params: Any


class FinishedRun:
    """The run in `workdir` (a path or URL, as given): its config, whether it finished, its
    metrics rows (all, per stage, RL steps), each eval stage's figures, its report and its
    final policy (lazy). Nothing is read before it is asked for, and nothing but the policy
    is kept: the files are read again at each call."""

    def __init__(self, workdir: str):
        self.workdir = workdir

    def __repr__(self) -> str:
        return f"FinishedRun({self.workdir!r})"

    @property
    def finished(self) -> bool:
        """Whether the run finished (its report.json exists)."""
        return storage.isfile(storage.join(self.workdir, "report.json"))

    def recorded_config(self) -> dict:
        """config.json as written (without its earlier configs), a plain dict."""
        record = json.loads(storage.read_text(storage.join(self.workdir, "config.json")))
        record.pop(HISTORY_FIELD, None)
        return record

    @property
    def config(self):
        """The run's config (config.json) as a ConfigDict."""
        import ml_collections

        return ml_collections.ConfigDict(self.recorded_config())

    def report(self) -> dict:
        """report.json: the figures per column, the labels, the code's provenance."""
        return json.loads(storage.read_text(storage.join(self.workdir, "report.json")))

    @property
    def report_path(self) -> str:
        """report.md, the human-readable report (tables and plots)."""
        return storage.join(self.workdir, "report.md")

    def metrics(self, stage: str | None = None) -> list[dict]:
        """metrics.jsonl's rows, of one stage when `stage` is given."""
        rows = read_metrics(self.workdir)
        return [r for r in rows if stage is None or r.get("stage") == stage]

    def stage_rows(self) -> dict[str, dict]:
        """{stage name: its last metrics row}: an eval stage's held-out figures, or a
        training stage's last step."""
        return {row["stage"]: row for row in read_metrics(self.workdir) if "stage" in row}

    def training_rows(self) -> list[dict]:
        """The RL steps of metrics.jsonl, in run order."""
        return [row for row in read_metrics(self.workdir)
                if "reward_mean" in row and "stage_step" in row]

    @property
    def evals(self) -> dict[str, dict]:
        """{eval stage: its held-out figures (its last row without stage, step, wall_time)},
        for the stages config.json names with kind "eval"."""
        recorded = self.recorded_config()
        names = [n.strip() for n in recorded["stages"].split(",") if n.strip()]
        kinds = {n: recorded[n].get("kind") for n in names}
        evals = {}
        for row in read_metrics(self.workdir):  # an eval stage's row: its figures (the last)
            if kinds.get(row.get("stage")) == "eval":
                evals[row["stage"]] = {k: v for k, v in row.items()
                                       if k not in ("stage", "step", "wall_time")}
        return evals

    def final_figures(self) -> dict:
        """The final evaluation figures (report.json's "after" column, else its last step's)
        and, as `train/<name>`, the last RL step's FINAL_TRAINING values."""
        report = self.report()
        summary = report.get("summary", report)
        column = summary.get("after") or summary.get("last_step") or {}
        figures = {k: v for k, v in column.items() if isinstance(v, (int, float))
                   and not isinstance(v, bool) and not k.endswith("_time_s")
                   and k not in ("num_problems", "num_samples", "num_completions")}
        rows = self.training_rows()
        if rows:
            figures.update({f"train/{k}": rows[-1][k] for k in FINAL_TRAINING if k in rows[-1]})
        return figures

    def eval_values(self, metrics: Sequence[str], final: str = "eval_final",
                    before: str = "eval_base") -> dict:
        """`metrics` of the last `final` evaluation, and of the `before` evaluation as
        "base_<metric>" (None where missing)."""
        stages = self.stage_rows()
        values = {name: stages.get(final, {}).get(name) for name in metrics}
        values.update({f"base_{name}": stages.get(before, {}).get(name) for name in metrics})
        return values

    @functools.cached_property
    def policy(self) -> TrainedPolicy:
        """The config, task, tokenizer, policy and final parameters, built as the run built
        them (`runner.model_init.load_run_policy`), the config's prompt bucket the one the run
        measured where it left it to the start-up; loaded once, when first asked for.

        Raises:
          FileNotFoundError: `workdir` is not a grpo_jax run directory, or has no checkpoint.
        """
        # The runner's builders (jax, the task, the tokenizer) only when a policy is asked for.
        from grpo_jax.runner.inputs import build_task
        from grpo_jax.runner.model_init import load_run_policy
        from grpo_jax.runner.run_directory import run_directory_config
        from grpo_jax.runner.tokenizers import build_tokenizer
        from grpo_jax.training import Policy

        config = run_directory_config(self.workdir)
        if config is None:
            raise FileNotFoundError(f"{self.workdir}: not a grpo_jax run directory (no "
                                    "config.json with stages and no checkpoints/)")
        task = build_task(config)
        tokenizer = build_tokenizer(config, task, self.workdir)
        if not config.task.get("prompt_len"):
            # The config left the prompt bucket to the start-up (task.prompt_len 0, e.g. the
            # reasoning-gym presets): measured again as the run measured it, for the sampler.
            from grpo_jax.runner.inputs import prompt_bucket

            config.task.prompt_len = prompt_bucket(config, task, tokenizer)
        _, model, _, _ = load_run_policy(self.workdir, tokenizer=tokenizer)
        policy, params = Policy.from_model(model)
        return TrainedPolicy(config, task, tokenizer, policy, params)

    def params_with(self, tokenizer) -> dict:
        """The final parameters as a plain dict (the latest checkpoint), the model built with
        `tokenizer` (another run's, e.g. its base's); not kept."""
        from flax import nnx

        from grpo_jax.runner.model_init import load_run_policy

        _, model, _, _ = load_run_policy(self.workdir, tokenizer=tokenizer)
        return nnx.to_pure_dict(nnx.state(model))
