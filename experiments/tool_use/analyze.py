"""The tool-use study's analysis: held-out figures with and without the calculator, before
and after GRPO, paired by seed.

Reads the finished runs of a sweep directory (`python -m grpo_jax.sweep --seeds=...` names
each run `seed=S`) and writes next to this file (or to --out): summary.json, table.md (the
README's tables), pass_at_1.png (the four held-out conditions) and curves.png (tool use and
training pass@1 over the GRPO steps).

    python experiments/tool_use/analyze.py --sweep=runs/experiments/tool_use/sweep

Differences are taken within a seed (the same base, held-out problems and keys), with a
95% interval over seeds (Student's t, `grpo_jax.sweep.paired_interval`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from grpo_jax import sweep  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402

STAGES = {"eval_base": "before, with the tool", "eval_base_no_tool": "before, without",
          "eval_final": "after GRPO, with the tool",
          "eval_final_no_tool": "after GRPO, without"}
FIGURES = ("pass@1", "pass@8", "correct_call_rate", "tool_call_rate", "tool_errors",
           "format_rate", "mean_length")
# (name, stage a, stage b): a minus b within a seed
CONTRASTS = (("GRPO, with the tool", "eval_final", "eval_base"),
             ("GRPO, without the tool", "eval_final_no_tool", "eval_base_no_tool"),
             ("the tool, before GRPO", "eval_base", "eval_base_no_tool"),
             ("the tool, after GRPO", "eval_final", "eval_final_no_tool"))
CURVES = ("tool_call_rate", "reward/correct_call", "pass@1", "turns", "tool_errors")


def analyze(runs) -> dict:
    figures = {run.seed: sweep.stage_figures(run) for run in runs}
    seeds = sorted(figures)

    def values(stage, name):
        return [figures[s].get(stage, {}).get(name, math.nan) for s in seeds]

    summary = {"seeds": seeds, "conditions": {}, "contrasts": {}, "training": {}}
    for stage in STAGES:
        summary["conditions"][stage] = {name: sweep.interval(values(stage, name))
                                        for name in FIGURES
                                        if not all(map(math.isnan, values(stage, name)))}
    for label, a, b in CONTRASTS:
        summary["contrasts"][label] = {
            name: sweep.paired_interval(values(a, name), values(b, name))
            for name in ("pass@1", "pass@8", "correct_call_rate")}
    rows = {run.seed: [r for r in read_metrics(run.workdir) if r.get("stage") == "rl"]
            for run in runs}
    for name in CURVES:
        first = [seed_rows[0].get(name, math.nan) for seed_rows in rows.values() if seed_rows]
        last = [sum(r.get(name, math.nan) for r in seed_rows[-10:]) / len(seed_rows[-10:])
                for seed_rows in rows.values() if seed_rows]
        summary["training"][name] = {"first_step": sweep.interval(first),
                                     "last_10_steps": sweep.interval(last),
                                     "change": sweep.paired_interval(last, first)}
    return summary


def table(summary: dict) -> str:
    fmt = sweep.format_interval
    lines = ["| held-out (128 problems x 8 samples) | pass@1 | pass@8 | correct tool use | "
             "episodes with a call | tool errors per episode |",
             "|---|---|---|---|---|---|"]
    for stage, label in STAGES.items():
        c = summary["conditions"][stage]
        def cell(name, scale=100.0, unit="%"):
            return fmt(c[name], scale) + unit if name in c else "-"

        lines.append(f"| {label} | {cell('pass@1')} | {cell('pass@8')} | "
                     f"{cell('correct_call_rate')} | {cell('tool_call_rate')} | "
                     f"{cell('tool_errors', 1.0, '')} |")
    lines += ["", "| paired difference (same seed) | pass@1 | pass@8 | correct tool use |",
              "|---|---|---|---|"]
    for label, stats in summary["contrasts"].items():
        lines.append(f"| {label} | {fmt(stats['pass@1'], signed=True)} points | "
                     f"{fmt(stats['pass@8'], signed=True)} points | "
                     f"{fmt(stats['correct_call_rate'], signed=True)} points |")
    lines += ["", "| during GRPO (training rollouts) | first step | last 10 steps | "
              "change (paired) |", "|---|---|---|---|"]
    for name, stats in summary["training"].items():
        scale = 1.0 if name in ("turns", "tool_errors") else 100.0
        lines.append(f"| {name} | {fmt(stats['first_step'], scale, 2)} | "
                     f"{fmt(stats['last_10_steps'], scale, 2)} | "
                     f"{fmt(stats['change'], scale, 2, signed=True)} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, runs, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    labels, means, halves = [], [], []
    for stage, label in STAGES.items():
        stats = summary["conditions"][stage]["pass@1"]
        labels.append(label.replace(", ", "\n"))
        means.append(stats["mean"] * 100)
        halves.append((stats["ci95"][1] - stats["ci95"][0]) / 2 * 100 if stats["n"] > 1 else 0)
    ax.bar(range(4), means, yerr=halves, capsize=4, color=["C0", "C7", "C2", "C7"])
    ax.set_xticks(range(4), labels, fontsize=8)
    ax.set_ylabel("held-out pass@1 (%)")
    ax.set_title("pass@1 with and without the calculator, 95% interval over seeds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pass_at_1.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, names in zip(axes, (("tool_call_rate", "reward/correct_call"), ("pass@1",),
                                ("turns", "tool_errors"))):
        for name in names:
            series = [[r.get(name, np.nan) for r in read_metrics(run.workdir)
                       if r.get("stage") == "rl"] for run in runs]
            length = min(len(s) for s in series)
            values = np.asarray([s[:length] for s in series], float)
            mean, std = np.nanmean(values, 0), np.nanstd(values, 0)
            steps = np.arange(1, length + 1)
            ax.plot(steps, mean, label=name)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    axes[0].set_title("tool use (training rollouts)", fontsize=9)
    axes[1].set_title("training pass@1", fontsize=9)
    axes[2].set_title("turns and tool errors per episode", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = [run for run in sweep.finished_runs(args.sweep) if not run.overrides]
    if not runs:
        raise SystemExit(f"{args.sweep}: no finished run (report.json) found")
    summary = analyze(runs)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, runs, args.out)
    print(text)


if __name__ == "__main__":
    main()
