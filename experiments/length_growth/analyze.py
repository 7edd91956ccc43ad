"""The length-growth study's analysis: does the response length grow over RL, with accuracy,
when longer reasoning pays (arithmetic with redos), and stay flat when it does not?

Reads the length-bias sweep (GRPO and Dr. GRPO from a base pretrained with redo_rate 0.3),
held_out.py's evaluations of its kept checkpoints (every 20th RL step) and, as the control
with redo_rate 0 (every trace of a problem has the same steps), the K = 0 runs of the
off-policy study (GRPO from the redo_rate 0 base, 60 steps). Writes next to this file (or to
--out): summary.json, table.md (the README's tables) and growth.png.

    python experiments/length_growth/analyze.py \
        --sweep=runs/experiments/length_bias/sweep \
        --held_out=runs/experiments/length_bias/held_out \
        --control=runs/experiments/off_policy/sweep

Training figures are the rollouts' (completion_length and pass@1 of each step's 128
completions; the first 10 steps against the last 10, paired by seed). Held-out figures are
those of all 128 x 8 completions of each kept checkpoint (the same problems throughout).
Correlations are Pearson's r within a run (over its steps, or its checkpoints), then a 95%
interval over seeds (Student's t).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os

from grpo_jax import sweep
from grpo_jax.metrics import read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))


def _length_bias_analysis():
    """experiments/length_bias/analyze.py, loaded from its file (its helpers are shared)."""
    spec = importlib.util.spec_from_file_location(
        "length_bias_analyze", os.path.join(os.path.dirname(HERE), "length_bias", "analyze.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bias = _length_bias_analysis()

CONTROL = "control (redo_rate 0)"
CURVES = ("completion_length", "pass@1")
HELD_OUT = (("length", 1.0, ""), ("redo_rate", 100.0, "%"), ("pass@1", 100.0, "%"))


def pearson(xs, ys) -> float:
    pairs = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    n = len(pairs)
    mx, my = sum(p[0] for p in pairs) / n, sum(p[1] for p in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def checkpoint_figures(held_out: str, workdir: str) -> dict[int, dict]:
    """RL step -> held-out figures of that checkpoint (the eval's and the samples')."""
    figures = {}
    for step, eval_dir in sorted(bias.held_out_dirs(held_out, os.path.basename(workdir))
                                 .items()):
        rows = [r for r in read_metrics(eval_dir) if r.get("stage") in bias.STAGES]
        if rows:
            figures[step] = {**rows[-1], **bias.sample_figures(
                os.path.join(eval_dir, "samples.jsonl"), rows[-1]["stage"])}
    return figures


def analyze(runs: dict, control: dict[int, str], held_out: str) -> dict:
    arms = {arm: runs[arm] for arm in bias.ARMS if arm in runs}
    if control:
        arms[CONTROL] = control
    summary = {"seeds": {arm: sorted(seeds) for arm, seeds in arms.items()}, "training": {},
               "held_out": {}, "held_out_change": {}, "correlation": {}, "redo_pays": {}}
    for arm, seeds in arms.items():
        rows = {s: bias.rl_rows(w) for s, w in seeds.items()}
        summary["training"][arm] = {"steps": sorted({len(r) for r in rows.values()})}
        for name in CURVES:
            first = [bias.window_mean(r, name, True) for r in rows.values()]
            # steps 51-60: the control's last 10, at the same point in every arm
            mid = [bias.window_mean(r[:60], name, False) for r in rows.values()]
            last = [bias.window_mean(r, name, False) for r in rows.values()]
            summary["training"][arm][name] = {
                "first_10": sweep.interval(first), "steps_51_60": sweep.interval(mid),
                "last_10": sweep.interval(last), "change_to_60": sweep.paired_interval(mid, first),
                "change": sweep.paired_interval(last, first)}
        summary["correlation"][arm] = {"training_steps": sweep.interval([
            pearson([bias.value(x, "completion_length") for x in r],
                    [bias.value(x, "pass@1") for x in r]) for r in rows.values()])}
        if arm == CONTROL:
            continue
        points = {s: checkpoint_figures(held_out, w) for s, w in seeds.items()}
        steps = sorted(set.intersection(*(set(p) for p in points.values())))
        if not steps:
            continue
        summary["held_out"][arm] = {
            str(k): {n: sweep.interval([points[s][k].get(n, math.nan) for s in seeds])
                     for n, _, _ in HELD_OUT + (("with_redo", 1, ""),)} for k in steps}
        summary["held_out_change"][arm] = {
            n: sweep.paired_interval([points[s][steps[-1]].get(n, math.nan) for s in seeds],
                                     [points[s][steps[0]].get(n, math.nan) for s in seeds])
            for n, _, _ in HELD_OUT}
        summary["correlation"][arm]["held_out_checkpoints"] = sweep.interval([
            pearson([points[s][k]["length"] for k in steps],
                    [points[s][k]["pass@1"] for k in steps]) for s in seeds])
        summary["correlation"][arm]["held_out_redo_vs_pass@1"] = sweep.interval([
            pearson([points[s][k]["redo_rate"] for k in steps],
                    [points[s][k]["pass@1"] for k in steps]) for s in seeds])
        for k, label in ((steps[0], "base"), (steps[-1], "final")):
            summary["redo_pays"].setdefault(arm, {})[label] = {
                "pass@1_redo": sweep.interval([points[s][k]["pass@1_redo_2step"]
                                               for s in seeds]),
                "pass@1_no_redo": sweep.interval([points[s][k]["pass@1_no_redo_2step"]
                                                  for s in seeds]),
                "difference": sweep.paired_interval(
                    [points[s][k]["pass@1_redo_2step"] for s in seeds],
                    [points[s][k]["pass@1_no_redo_2step"] for s in seeds])}
    return summary


def table(summary: dict) -> str:
    fmt = bias.fmt
    lines = ["| training rollouts | arm | seeds x steps | steps 1-10 | steps 51-60 | "
             "51-60 minus 1-10 (paired) | last 10 steps | last 10 minus 1-10 (paired) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in CURVES:
        scale = 100.0 if name == "pass@1" else 1.0
        for arm, t in summary["training"].items():
            n, t = len(summary["seeds"][arm]), {**t[name], "steps": t["steps"]}
            lines.append(f"| {name} | {arm} | {n} x {'/'.join(map(str, t['steps']))} | "
                         f"{fmt(t['first_10'], scale)} | {fmt(t['steps_51_60'], scale)} | "
                         f"{fmt(t['change_to_60'], scale, signed=True)} | "
                         f"{fmt(t['last_10'], scale)} | {fmt(t['change'], scale, signed=True)} |")
    for arm, points in summary["held_out"].items():
        lines += ["", f"| held-out, {arm} (128 x 8) | " + " | ".join(
            f"step {k}" for k in points) + " | last - first (paired) |",
            "|---" * (len(points) + 2) + "|"]
        for name, scale, unit in HELD_OUT:
            change = summary["held_out_change"][arm][name]
            lines.append(f"| {name} | " + " | ".join(
                fmt(p[name], scale) + unit for p in points.values())
                + f" | {fmt(change, scale, signed=True)}{' pt' if unit else ''} |")
    lines += ["", "| Pearson r within a run (mean ± 95% interval over seeds) | arm | r |",
              "|---|---|---|"]
    labels = {"training_steps": "training length vs training pass@1, over steps",
              "held_out_checkpoints": "held-out length vs held-out pass@1, over checkpoints",
              "held_out_redo_vs_pass@1": "held-out redo rate vs pass@1, over checkpoints"}
    for arm, corr in summary["correlation"].items():
        for key, stats in corr.items():
            lines.append(f"| {labels[key]} | {arm} | {fmt(stats, 1.0, 2, signed=True)} |")
    lines += ["", "| held-out two-operator problems, completions with / without a redo | arm | "
              "checkpoint | "
              "pass@1 with a redo | without | difference (paired) |",
              "|---|---|---|---|---|---|"]
    for arm, by in summary["redo_pays"].items():
        for label, stats in by.items():
            lines.append(f"| | {arm} | {label} | {fmt(stats['pass@1_redo'], 100.0)}% | "
                         f"{fmt(stats['pass@1_no_redo'], 100.0)}% | "
                         f"{fmt(stats['difference'], 100.0, signed=True)} pt |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, runs: dict, control: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = {arm: runs[arm] for arm in bias.ARMS if arm in runs}
    if control:
        arms[CONTROL] = control
    colors = {"grpo": "C0", "dr_grpo": "C3", CONTROL: "C7"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for ax, name in zip(axes[:2], CURVES):
        for arm, seeds in arms.items():
            steps, mean, std = bias.curve(seeds.values(), name)
            scale = 100.0 if name == "pass@1" else 1.0
            mean, std = bias.smooth(mean) * scale, bias.smooth(std) * scale
            ax.plot(steps, mean, color=colors[arm], label=arm)
            ax.fill_between(steps, mean - std, mean + std, color=colors[arm], alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    axes[0].set_title("completion length (training rollouts, tokens)", fontsize=9)
    axes[1].set_title("training pass@1 (%)", fontsize=9)
    ax = axes[2]
    for arm, points in summary["held_out"].items():
        steps = [int(k) for k in points]
        for name, style in (("redo_rate", "-o"), ("pass@1", "--s")):
            means = [p[name]["mean"] * 100 for p in points.values()]
            halves = [(p[name]["ci95"][1] - p[name]["ci95"][0]) / 2 * 100
                      if p[name]["n"] > 1 else 0 for p in points.values()]
            ax.errorbar(steps, means, yerr=halves, fmt=style, color=colors[arm], capsize=3,
                        markersize=4, label=f"{arm}: {name}")
    ax.set_xlabel("GRPO step (kept checkpoints)")
    ax.set_title("held-out redos per step and pass@1 (%), 95% interval", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle("training curves: mean ± std over seeds, 5-step moving average", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "growth.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the length-bias sweep directory")
    parser.add_argument("--held_out", required=True, help="held_out.py's --out")
    parser.add_argument("--control", default="", help="the off-policy sweep (K = 0 runs)")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = bias.load_runs(args.sweep)
    if not runs:
        raise SystemExit(f"{args.sweep}: no finished run (report.json) found")
    control = {}
    if args.control:
        stale = bias.load_runs(args.control, arm_key="rl.max_staleness")
        control = {s: w for s, w in stale.get("0", {}).items()
                   if "off_policy_correction" not in os.path.basename(w)}
    summary = analyze(runs, control, args.held_out)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = table(summary)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    plot(summary, runs, control, args.out)
    print(text)


if __name__ == "__main__":
    main()
