"""The run report: one column per eval stage, RL curves over the run's global step, plots."""

from __future__ import annotations

from grpo_jax import evals as evals_lib
from grpo_jax import parallel
from grpo_jax.metrics import read_metrics

PLOTS = ("reward_mean", "pass@1", "reward/format", "completion_length", "kl_ref", "kl_step",
         "clip_frac")


def write_run_report(run) -> dict:
    """report.md / report.json / plots; returns the summary (column -> figures).

    The first eval stage is the "before" column and the last the "after" column; evals in
    between keep their stage names, in run order. Curves come from the stages whose kind
    logs RL curves (`StageKind.rl_curves`), one line per stage against the global step
    (metrics.jsonl's "step"), so a later RL stage follows an earlier one on the x axis.
    """
    names = [n for n in run.stage_names if n in run.evals]
    summary = {}
    for i, n in enumerate(names):
        column = "before" if i == 0 else "after" if i == len(names) - 1 else n
        summary[column] = run.evals[n]
    rows = read_metrics(run.writer.path)
    rl_kinds = run.kinds.rl_kinds()
    history = [r for r in rows if r.get("stage") in
               {s for s in run.stage_names if run.config[s].kind in rl_kinds}]
    if not summary and rows:  # no eval stage: report the last logged step
        summary["last_step"] = {k: v for k, v in rows[-1].items()
                                if isinstance(v, (int, float)) and k != "wall_time"}
    if not summary or not parallel.is_primary():  # process 0 writes the report
        return summary
    evals_lib.write_report(
        run.workdir, title=f"grpo_jax run: {run.config.task.name}", summary=summary,
        history=history, plots=PLOTS, step_key="step", group_key="stage",
    )
    return summary
