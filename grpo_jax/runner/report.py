"""The run report: one column per eval stage, RL curves over the run's global step, plots."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from grpo_jax import evals as evals_lib
from grpo_jax import parallel
from grpo_jax.machine import machine, machine_words
from grpo_jax.metrics import read_metrics

PLOTS = ("reward_mean", "pass@1", "reward/format", "completion_length", "kl_ref", "kl_step",
         "clip_frac")


# Kinds whose stages leave the policy as it is: an eval after one evaluates the stage before.
POLICY_KEEPING_KINDS = ("eval", "reward_model")


def eval_columns(stage_names, kinds, evals) -> list[tuple[str, str, str | None, str]]:
    """One (column name, eval stage, evaluated stage, label) per finished eval, in run order.

    Column names are roles that sweeps and callers read: "after" is the last eval (the
    run's final figures; also a lone eval with no training after it, e.g. an eval-only
    run), "before" the first one when there are two or more (or a lone eval that training
    follows), and the evals in between keep their stage names. The evaluated stage is the
    nearest earlier stage of a kind that trains the policy (None where none came before:
    the initial policy, from model.init_from or a fresh init), and it labels the column
    ("model" for None); two evals of the same stage add their own names, "rl (eval_t0)".

    Args:
      stage_names: the run's stages in order.
      kinds: stage name -> kind name.
      evals: eval stage name -> figures (only the finished ones are columns).
    """
    names = [n for n in stage_names if n in evals]
    trains = [kinds[n] not in POLICY_KEEPING_KINDS for n in stage_names]
    evaluated = {}
    for name in names:
        index = stage_names.index(name)
        earlier = [s for s, t in zip(stage_names[:index], trains[:index]) if t]
        evaluated[name] = earlier[-1] if earlier else None
    out = []
    for i, name in enumerate(names):
        if i == len(names) - 1 and (i > 0 or not any(trains[stage_names.index(name):])):
            column = "after"
        elif i == 0:
            column = "before"
        else:
            column = name
        label = evaluated[name] or "model"
        if sum(evaluated[n] == evaluated[name] for n in names) > 1:
            label = f"{label} ({name})"
        out.append((column, name, evaluated[name], label))
    return out


def _machine_line(found: dict | None) -> str:
    """report.md's tail of the "Code:" line: the machine, its logical CPUs and XLA_FLAGS."""
    if not found:
        return ""
    flags = f", XLA_FLAGS {found['xla_flags']!r}" if found.get("xla_flags") else ""
    return f"; CPU {machine_words(found)}, {found.get('cpus')} logical{flags}"


def code_provenance() -> dict:
    """What code made a run: the git commit of the grpo_jax checkout (None outside one,
    e.g. an installed wheel), whether tracked files other than experiments/ (the studies'
    published outputs, which compute nothing) differed from it, the versions of Python,
    jax and flax, and the `machine`. Read when the run starts, kept in report.json."""
    import flax  # pylint: disable=import-outside-toplevel
    import jax  # pylint: disable=import-outside-toplevel

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args):
        try:
            done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD") if os.path.exists(os.path.join(root, ".git")) else None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 ":(exclude)experiments") if commit else None
    return {"commit": commit, "modified": bool(status) if status is not None else None,
            "python": platform.python_version(), "jax": jax.__version__,
            "flax": flax.__version__, "argv": list(sys.argv), "machine": machine()}


def stage_timing(run, rows: list[dict]) -> dict[str, dict]:
    """Per finished stage: its kind, wall and compilation seconds (over every session of a
    resumed run), the steps, the seconds per step without compilation (the mean of the
    logged step_time_s) and the tokens per second of those steps (target tokens trained by
    pretrain / SFT, completion tokens sampled by RL)."""
    out = {}
    for name in run.stage_names:
        took = run.stage_times.get(name)
        if took is None:
            continue
        lines = [r for r in rows if r.get("stage") == name
                 and isinstance(r.get("step_time_s"), (int, float))]
        entry = {"kind": run.config[name].kind, "wall_s": took["wall_s"],
                 "compile_s": took["compile_s"], "steps": took.get("steps", 0)}
        seconds = sum(r["step_time_s"] for r in lines)
        if lines:
            entry["s_per_step"] = seconds / len(lines)
        tokens = [r.get("tokens", r.get("completion_tokens")) for r in lines]
        if lines and all(isinstance(t, (int, float)) for t in tokens) and seconds > 0:
            entry["tokens_per_s"] = sum(tokens) / seconds
        out[name] = entry
    return out


def timing_table(timing: dict[str, dict]) -> list[str]:
    """report.md's lines for `stage_timing`."""
    if not timing:
        return []
    lines = ["| stage | kind | wall s | compiling s | steps | s/step (no compiling) | tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, t in timing.items():
        per_step = f"{t['s_per_step']:.3f}" if "s_per_step" in t else ""
        rate = f"{t['tokens_per_s']:,.0f}" if "tokens_per_s" in t else ""
        lines.append(f"| {name} | {t['kind']} | {t['wall_s']:.1f} | {t['compile_s']:.1f} | "
                     f"{t['steps'] or ''} | {per_step} | {rate} |")
    lines.append("")
    lines.append("tokens/s: target tokens trained per second (pretrain, SFT) or completion "
                 "tokens sampled per second (RL), over the steps' time without compiling.")
    return lines


def reward_guard_totals(rows: list[dict]) -> dict[str, float]:
    """The Python rewards' guard counts (`grpo_jax.rewards.python.reward_error_record`:
    reward_errors, reward_errors/<reason>, reward_slow) summed over the logged steps; {}
    when no step logged them."""
    keys = dict.fromkeys(k for r in rows for k in r  # in the order they are logged
                         if k in ("reward_errors", "reward_slow")
                         or k.startswith("reward_errors/"))
    return {k: float(sum(r[k] for r in rows if isinstance(r.get(k), (int, float))))
            for k in keys}


def reward_guard_line(totals: dict[str, float]) -> str:
    """report.md's line for `reward_guard_totals`."""
    reasons = ", ".join(f"{k.split('/', 1)[1]} {v:.0f}" for k, v in totals.items()
                        if k.startswith("reward_errors/") and v)
    return (f"Python rewards: {totals.get('reward_errors', 0):.0f} completions scored 0 by "
            f"the guard (reward_errors{': ' + reasons if reasons else ''}); "
            f"{totals.get('reward_slow', 0):.0f} scored by calls over their budget "
            "(reward_slow).")


def write_run_report(run) -> dict:
    """report.md / report.json / plots; returns the summary (column -> figures).

    One column per finished eval stage, keyed by its role (`eval_columns`: "before",
    "after", or the stage name in between) and headed in report.md by the stage it
    evaluates ("model" for an eval of the initial policy, e.g. an eval-only run). Curves
    come from the stages whose kind logs RL curves (`StageKind.rl_curves`), one line per
    stage against the global step (metrics.jsonl's "step"), so a later RL stage follows an
    earlier one on the x axis.
    """
    columns = eval_columns(list(run.stage_names),
                           {n: run.config[n].kind for n in run.stage_names}, run.evals)
    summary = {column: run.evals[name] for column, name, _, _ in columns}
    labels = {column: label for column, _, _, label in columns}
    notes = ["Columns: " + "; ".join(
        f"{label} = stage {name}, evaluating " + (
            f"the policy after stage {of}" if of else
            "the initial policy (model.init_from, or a fresh init)")
        for _, name, of, label in columns) + "."] if columns else []
    run.writer.flush()  # on an object store metrics.jsonl is written now and then
    rows = read_metrics(run.writer.path)
    rl_kinds = run.kinds.rl_kinds()
    history = [r for r in rows if r.get("stage") in
               {s for s in run.stage_names if run.config[s].kind in rl_kinds}]
    if not summary and rows:  # no eval stage: report the last logged step
        summary["last_step"] = {k: v for k, v in rows[-1].items()
                                if isinstance(v, (int, float)) and k != "wall_time"}
    if not summary or not parallel.is_primary():  # process 0 writes the report
        return summary
    if getattr(run, "lora_line", None):
        notes.append("LoRA" + run.lora_line[len("lora"):] + ".")
    timing = stage_timing(run, rows)
    notes += ["", "Time per stage:", "", *timing_table(timing)] if timing else []
    guard = reward_guard_totals(history)
    notes += ["", reward_guard_line(guard)] if guard else []
    code = getattr(run, "provenance", None)
    if code:
        commit = code["commit"][:12] if code["commit"] else "not a git checkout"
        notes.append(f"Code: grpo_jax {commit}" + (" with modified files" if code["modified"]
                                                      else "")
                     + f"; jax {code['jax']}, flax {code['flax']}, Python {code['python']}"
                     + _machine_line(code.get("machine")) + ".")
    evals_lib.write_report(
        run.workdir, title=f"grpo_jax run: {run.config.task.name}", summary=summary,
        history=history, plots=PLOTS, draw=run.config.get("report_plots", True),
        step_key="step", group_key="stage", labels=labels,
        notes=notes, extra={"timing": timing, **({"reward_errors": guard} if guard else {}),
                            **({"provenance": code} if code else {})},
    )
    return summary
