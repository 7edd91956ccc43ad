"""The off-policy study's analysis: each arm (K, correction) against K = 0, paired by seed.

Reads the finished runs of a sweep directory (`python -m grpo_jax.sweep` names each run
`rl.max_staleness=K[,rl.off_policy_correction=C],seed=S`), and writes next to this file (or
to --out): summary.json, table.md (the README's table) and pass_at_1_vs_k.png (final
held-out pass@1 against K as the paired difference to K = 0, one line per correction)
and curves.png (training pass@1 and the sampler / trainer KL over the RL steps).

    python experiments/off_policy/analyze.py --sweep=runs/experiments/off_policy/sweep

Every difference is arm minus K = 0 for the same seed (the same base, the same held-out
problems, the same prompt order and keys), with a 95% interval over seeds (Student's t,
`grpo_jax.sweep.paired_interval`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from grpo_jax import sweep  # noqa: E402

FIGURES = ("pass@1", "pass@8", "maj@8", "format_rate")
TRAINING = ("kl_behaviour", "is_weight_max", "staleness", "reward_mean")


def arm_of(run) -> tuple[int, str]:
    overrides = dict(run.overrides)
    k = int(overrides.get("rl.max_staleness", 0))
    return k, "-" if k == 0 else overrides.get("rl.off_policy_correction", "tis")


def analyze(runs) -> dict:
    by_arm: dict[tuple[int, str], dict[int, sweep.Run]] = {}
    for run in runs:
        by_arm.setdefault(arm_of(run), {})[run.seed] = run
    base = by_arm.get((0, "-"), {})
    figures = {arm: {seed: sweep.final_figures(run) for seed, run in members.items()}
               for arm, members in by_arm.items()}
    training = {}
    for arm, members in by_arm.items():
        rows = {seed: sweep.training_rows(run) for seed, run in members.items()}
        training[arm] = {name: sweep.interval(
            [max(r.get(name, math.nan) for r in seed_rows) if name == "is_weight_max"
             else sum(r.get(name, math.nan) for r in seed_rows) / len(seed_rows)
             for seed_rows in rows.values() if seed_rows]) for name in TRAINING}
    summary = {}
    for arm in sorted(by_arm):
        seeds = sorted(by_arm[arm])
        entry = {"seeds": seeds, "figures": {}, "paired_vs_k0": {}, "training": training[arm]}
        for name in FIGURES:
            values = [figures[arm][s].get(name) for s in seeds]
            entry["figures"][name] = sweep.interval(values)
            if base and arm != (0, "-"):
                paired = sweep.paired_interval(values, [figures[(0, "-")].get(s, {}).get(name)
                                                        for s in seeds])
                entry["paired_vs_k0"][name] = {**paired, "paired": True}
        summary[f"K={arm[0]},{arm[1]}"] = entry
    return summary


def table(summary: dict) -> str:
    fmt = sweep.format_interval
    lines = ["| K | correction | seeds | pass@1 | pass@1 - K=0 (paired) | pass@8 | "
             "pass@8 - K=0 (paired) | mean KL(sampler ‖ trainer) per token | "
             "largest IS weight |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary.items():
        k, correction = name.split(",")
        paired = entry["paired_vs_k0"]
        lines.append(
            f"| {k[2:]} | {correction} | {len(entry['seeds'])} | "
            f"{fmt(entry['figures']['pass@1'])}% | "
            f"{fmt(paired['pass@1'], signed=True) + '%' if 'pass@1' in paired else '-'} | "
            f"{fmt(entry['figures']['pass@8'])}% | "
            f"{fmt(paired['pass@8'], signed=True) + '%' if 'pass@8' in paired else '-'} | "
            f"{fmt(entry['training']['kl_behaviour'], 1.0, 4)} | "
            f"{fmt(entry['training']['is_weight_max'], 1.0, 2)} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, runs, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    corrections = sorted({name.split(",")[1] for name in summary} - {"-"})
    zero = {"mean": 0.0, "n": 0, "ci95": [0.0, 0.0]}
    for index, correction in enumerate(corrections):
        points = [(int(name.split(",")[0][2:]), entry["paired_vs_k0"]["pass@1"])
                  for name, entry in summary.items() if name.split(",")[1] == correction
                  and "pass@1" in entry["paired_vs_k0"]]
        points.append((0, zero))
        points.sort(key=lambda p: p[0])
        ks = [k for k, _ in points]
        means = np.array([s["mean"] for _, s in points]) * 100
        halves = np.array([(s["ci95"][1] - s["ci95"][0]) / 2 if s["n"] > 1 else 0
                           for _, s in points]) * 100
        ax.errorbar(np.array(ks) + 0.08 * (index - 1), means, yerr=halves, marker="o",
                    capsize=3, label=correction)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xlabel("max staleness K (updates)")
    ax.set_ylabel("pass@1 minus K = 0, same seed (points)")
    ax.set_title("held-out pass@1 vs K: paired difference, 95% interval", fontsize=10)
    ax.legend(title="correction", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pass_at_1_vs_k.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    by_arm: dict[str, list] = {}
    for run in runs:
        k, correction = arm_of(run)
        by_arm.setdefault(f"K={k},{correction}", []).append(sweep.training_rows(run))
    for index, (arm, curves) in enumerate(sorted(by_arm.items())):
        for ax, name in zip(axes, ("pass@1", "kl_behaviour")):
            series = [[r.get(name, np.nan) for r in rows] for rows in curves if rows]
            length = min(len(s) for s in series)
            values = np.asarray([s[:length] for s in series], float)
            if np.isnan(values).all():
                continue
            ax.plot(np.arange(1, length + 1), np.nanmean(values, 0), label=arm,
                    color=plt.cm.tab20(index % 20))
    for ax, name in zip(axes, ("training pass@1", "KL(sampler ‖ trainer), k3")):
        ax.set_title(name)
        ax.set_xlabel("RL step")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = sweep.finished_runs(args.sweep)
    if not runs:
        raise SystemExit(f"{args.sweep}: no finished run (report.json) found")
    summary = analyze(runs)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, runs, args.out)
    print(text)


if __name__ == "__main__":
    main()
