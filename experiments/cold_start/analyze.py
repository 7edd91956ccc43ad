"""The cold-start study's analysis: R1-Zero (RL from the base) against R1's cold start (SFT on
a few clean solutions, RL, rejection-sampling SFT, RL), paired by seed.

Reads the two sweep directories (`python -m grpo_jax.sweep --seeds=...` names each run
`seed=S`) and writes next to this file (or to --out): summary.json, table.md (the README's
tables) and curves.png (held-out pass@1 after each stage, and the RL stages' training
curves).

    python experiments/cold_start/analyze.py --zero=runs/experiments/cold_start/zero \
        --cold=runs/experiments/cold_start/cold

Differences are taken within a seed (the same base and held-out problems), with a 95%
interval over seeds (Student's t, `grpo_jax.sweep.paired_interval`).
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

# (arm, eval stage, label), in pipeline order
POINTS = (("zero", "eval_base", "base"),
          ("zero", "eval_rl", "R1-Zero: RL 60"),
          ("zero", "eval_final", "R1-Zero: RL 60 + 30"),
          ("cold", "eval_cold", "cold-start SFT"),
          ("cold", "eval_rl", "cold start -> RL 60"),
          ("cold", "eval_rsft", "cold start -> RL 60 -> rejection SFT"),
          ("cold", "eval_final", "cold start -> RL 60 -> rejection SFT -> RL 30"))
FIGURES = ("pass@1", "pass@8", "maj@8", "format_rate", "mean_length")
# (label, (arm, stage) a, (arm, stage) b): a minus b within a seed
CONTRASTS = (("cold-start SFT on the base", ("cold", "eval_cold"), ("zero", "eval_base")),
             ("RL 60 from the base (R1-Zero)", ("zero", "eval_rl"), ("zero", "eval_base")),
             ("RL 60 after the cold start", ("cold", "eval_rl"), ("cold", "eval_cold")),
             ("cold start vs R1-Zero, after RL 60", ("cold", "eval_rl"), ("zero", "eval_rl")),
             ("rejection SFT, after RL 60", ("cold", "eval_rsft"), ("cold", "eval_rl")),
             ("final RL 30 after rejection SFT", ("cold", "eval_final"), ("cold", "eval_rsft")),
             ("final RL 30 (R1-Zero)", ("zero", "eval_final"), ("zero", "eval_rl")),
             ("R1 pipeline vs R1-Zero, final", ("cold", "eval_final"), ("zero", "eval_final")))
EARLY = 10  # training steps averaged at the start of an RL stage


def training(run, stage: str, name: str) -> list[float]:
    return [r.get(name, math.nan) for r in read_metrics(run.workdir)
            if r.get("stage") == stage and "reward_mean" in r]


def analyze(arms: dict) -> dict:
    seeds = sorted(set.intersection(*(set(runs) for runs in arms.values())))
    figures = {arm: {s: sweep.stage_figures(runs[s]) for s in seeds}
               for arm, runs in arms.items()}

    def values(point, name):
        arm, stage = point
        return [figures[arm][s].get(stage, {}).get(name, math.nan) for s in seeds]

    summary = {"seeds": seeds, "points": {}, "contrasts": {}, "training": {}}
    for arm, stage, label in POINTS:
        summary["points"][f"{arm}/{stage}"] = {
            "label": label, **{name: sweep.interval(values((arm, stage), name))
                               for name in FIGURES}}
    for label, a, b in CONTRASTS:
        summary["contrasts"][label] = {name: sweep.paired_interval(values(a, name),
                                                                   values(b, name))
                                       for name in FIGURES}
    for arm, runs in arms.items():
        for stage in ("rl", "final_rl"):
            for name in ("pass@1", "reward/format"):
                series = [training(runs[s], stage, name) for s in seeds]
                early = [sum(x[:EARLY]) / len(x[:EARLY]) for x in series if x]
                late = [sum(x[-EARLY:]) / len(x[-EARLY:]) for x in series if x]
                summary["training"][f"{arm}/{stage}/{name}"] = {
                    "first_10": sweep.interval(early), "last_10": sweep.interval(late)}
    early = {arm: [sum(training(runs[s], "rl", "pass@1")[:EARLY]) / EARLY for s in seeds]
             for arm, runs in arms.items()}
    summary["contrasts"]["training pass@1, first 10 RL steps: cold - zero"] = {
        "pass@1": sweep.paired_interval(early["cold"], early["zero"])}
    return summary


def table(summary: dict) -> str:
    f = sweep.format_interval
    lines = ["| held-out (128 problems x 8 samples) | pass@1 | pass@8 | maj@8 | format | "
             "length |", "|---|---|---|---|---|---|"]
    for point in summary["points"].values():
        lines.append(f"| {point['label']} | {f(point['pass@1'])}% | {f(point['pass@8'])}% | "
                     f"{f(point['maj@8'])}% | {f(point['format_rate'])}% | "
                     f"{f(point['mean_length'], 1.0)} |")
    lines += ["", "| paired difference (same seed), points | pass@1 | pass@8 | maj@8 | format |",
              "|---|---|---|---|---|"]
    for label, stats in summary["contrasts"].items():
        cells = [f(stats[n], signed=True) if n in stats else "" for n in FIGURES[:4]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| training rollouts | first 10 steps | last 10 steps |", "|---|---|---|"]
    for key, stats in summary["training"].items():
        lines.append(f"| {key} | {f(stats['first_10'])}% | {f(stats['last_10'])}% |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, arms: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    for arm, color, xs in (("zero", "C0", (0, 1, 3)), ("cold", "C3", (0.1, 1.1, 2.1, 3.1))):
        points = [p for key, p in summary["points"].items() if key.startswith(arm + "/")]
        means = [p["pass@1"]["mean"] * 100 for p in points]
        halves = [(p["pass@1"]["ci95"][1] - p["pass@1"]["ci95"][0]) / 2 * 100 for p in points]
        ax.errorbar(xs, means, yerr=halves, marker="o", capsize=3, color=color,
                    label="R1-Zero (RL only)" if arm == "zero" else "cold start + rejection SFT")
    ax.set_xticks([0, 1, 2, 3], ["before RL", "RL 60", "rejection\nSFT", "RL 90"], fontsize=8)
    ax.set_ylabel("held-out pass@1 (%)")
    ax.set_title("held-out pass@1 after each stage (95% interval over seeds)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    for arm, color in (("zero", "C0"), ("cold", "C3")):
        series = [training(arms[arm][s], "rl", "pass@1") + training(arms[arm][s], "final_rl",
                                                                     "pass@1")
                  for s in summary["seeds"]]
        length = min(len(x) for x in series)
        values = np.asarray([x[:length] for x in series]) * 100
        steps = np.arange(1, length + 1)
        ax.plot(steps, values.mean(0), color=color, label=arm)
        ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2)
    ax.axvline(60.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("GRPO step (rl, then final_rl; cold: rejection SFT between)")
    ax.set_ylabel("training pass@1 (%)")
    ax.set_title("training rollouts: mean and range over seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", required=True, help="the R1-Zero sweep directory")
    parser.add_argument("--cold", required=True, help="the cold-start sweep directory")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    arms = {arm: {run.seed: run for run in sweep.finished_runs(root)}
            for arm, root in (("zero", args.zero), ("cold", args.cold))}
    if not all(arms.values()):
        raise SystemExit("no finished run in one of the sweep directories")
    summary = analyze(arms)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, arms, args.out)
    print(text)


if __name__ == "__main__":
    main()
