"""The distillation study's analysis: a small pretrained student distilled from a larger
RL-trained teacher against the same student trained with GRPO, paired by seed.

Reads the two sweep directories (`python -m grpo_jax.sweep --seeds=...` names each run
`seed=S`) and the teacher's run directory, and writes next to this file (or to --out):
summary.json, table.md (the README's tables) and pass_at_k.png (held-out pass@k of the
student before, after each arm, and of the teacher). `--rl_long` adds a GRPO arm of three
times the steps.

    python experiments/distill_vs_rl/analyze.py --distill=runs/experiments/distill_vs_rl/distill \
        --rl=runs/experiments/distill_vs_rl/rl --rl_long=runs/experiments/distill_vs_rl/rl_long \
        --teacher=runs/experiments/off_policy/sweep/rl.max_staleness=0,seed=0

Differences are taken within a seed (the same student base and held-out problems), with a
95% interval over seeds (Student's t, `grpo_jax.sweep.paired_interval`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from grpo_jax import sweep  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402

FIGURES = ("pass@1", "pass@2", "pass@4", "pass@8", "maj@8", "format_rate", "mean_length")
KS = (1, 2, 4, 8)


def stage_seconds(run) -> dict[str, float]:
    """Each stage's wall time, from the run's log ("stage NAME (KIND) done in S s")."""
    with open(os.path.join(run.workdir, "sweep.log"), encoding="utf-8", errors="replace") as f:
        return {m.group(1): float(m.group(2))
                for m in re.finditer(r"stage (\S+) \(\S+\) done in ([\d.]+)s", f.read())}


def distill_data(run) -> dict:
    with open(os.path.join(run.workdir, "distill", "data.jsonl"), encoding="utf-8") as f:
        return json.loads(f.readline())["info"]


def analyze(arms: dict, teacher: str) -> dict:
    seeds = sorted(set.intersection(*(set(runs) for runs in arms.values())))
    figures = {arm: {s: sweep.stage_figures(runs[s]) for s in seeds}
               for arm, runs in arms.items()}

    def values(arm, stage, name):
        return [figures[arm][s].get(stage, {}).get(name, math.nan) for s in seeds]

    teacher_eval = [r for r in read_metrics(teacher) if r.get("stage") == "eval_final"][-1]
    summary = {"seeds": seeds, "teacher": {n: teacher_eval.get(n) for n in FIGURES},
               "student_base": {}, "after": {}, "contrasts": {}, "cost": {}}
    for name in FIGURES:
        # The base is evaluated by both arms' eval_base: the same parameters and problems,
        # the seed's own samples; the distill arm's is reported.
        summary["student_base"][name] = sweep.interval(values("distill", "eval_base", name))
    for arm in arms:
        summary["after"][arm] = {n: sweep.interval(values(arm, "eval_final", n))
                                 for n in FIGURES}
        summary["contrasts"][f"{arm}: after - before"] = {
            n: sweep.paired_interval(values(arm, "eval_final", n), values(arm, "eval_base", n))
            for n in FIGURES}
    for arm in arms:
        if arm != "distill":
            summary["contrasts"][f"distill - {arm}, after"] = {
                n: sweep.paired_interval(values("distill", "eval_final", n),
                                         values(arm, "eval_final", n)) for n in FIGURES}
    summary["contrasts"]["distilled student - teacher"] = {
        n: sweep.interval([v - summary["teacher"][n] for v in
                           values("distill", "eval_final", n)]) for n in FIGURES}
    data = [distill_data(arms["distill"][s]) for s in seeds]
    summary["cost"] = {
        "distill_seconds": sweep.interval([stage_seconds(arms["distill"][s]).get("distill")
                                           for s in seeds]),
        **{f"{arm}_seconds": sweep.interval([stage_seconds(arms[arm][s]).get("rl")
                                             for s in seeds]) for arm in arms if arm != "distill"},
        "teacher_samples": sweep.interval([d["sampled"] for d in data]),
        "kept_rows": sweep.interval([d["kept"] for d in data]),
        "problems_covered": sweep.interval([d["problems_covered"] for d in data])}
    return summary


def table(summary: dict) -> str:
    f = sweep.format_interval
    names = FIGURES[:6]
    lines = ["| held-out (128 problems x 8 samples) | " + " | ".join(names) + " | length |",
             "|---|" + "---|" * (len(names) + 1)]

    def row(label, stats):
        lines.append(f"| {label} | " + " | ".join(f(stats[n]) + "%" for n in names)
                     + f" | {f(stats['mean_length'], 1.0)} |")

    row("student (tiny-300k), pretrained", summary["student_base"])
    row("student after GRPO (60 steps)", summary["after"]["rl"])
    if "rl_long" in summary["after"]:
        row("student after GRPO (180 steps)", summary["after"]["rl_long"])
    row("student distilled from the teacher", summary["after"]["distill"])
    teacher = summary["teacher"]
    lines.append("| teacher (tiny-1m after GRPO), one run | "
                 + " | ".join(f"{teacher[n] * 100:.1f}%" for n in names)
                 + f" | {teacher['mean_length']:.1f} |")
    lines += ["", "| paired difference (same seed), points | " + " | ".join(names) + " |",
              "|---|" + "---|" * len(names)]
    for label, stats in summary["contrasts"].items():
        lines.append(f"| {label} | " + " | ".join(f(stats[n], signed=True) for n in names)
                     + " |")
    cost = summary["cost"]
    lines += ["", "| cost (per seed) | |", "|---|---|",
              f"| GRPO stage wall time, 60 steps | {f(cost['rl_seconds'], 1.0, 0)} s |",
              *([f"| GRPO stage wall time, 180 steps | {f(cost['rl_long_seconds'], 1.0, 0)} s |"]
                if "rl_long_seconds" in cost else []),
              f"| distill stage wall time (teacher sampling + SFT) | "
              f"{f(cost['distill_seconds'], 1.0, 0)} s |",
              f"| teacher samples | {f(cost['teacher_samples'], 1.0, 0)} |",
              f"| verified distinct rows kept | {f(cost['kept_rows'], 1.0, 0)} "
              f"(problems covered: {f(cost['problems_covered'], 1.0, 0)} of 960) |"]
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    curves = (("student, pretrained", summary["student_base"], "C7"),
              ("student + GRPO, 60 steps", summary["after"]["rl"], "C0"),
              ("student + GRPO, 180 steps", summary["after"].get("rl_long"), "C2"),
              ("student distilled", summary["after"]["distill"], "C3"))
    for label, stats, color in curves:
        if stats is None:
            continue
        means = [stats[f"pass@{k}"]["mean"] * 100 for k in KS]
        halves = [(stats[f"pass@{k}"]["ci95"][1] - stats[f"pass@{k}"]["ci95"][0]) / 2 * 100
                  for k in KS]
        ax.errorbar(KS, means, yerr=halves, marker="o", capsize=3, color=color, label=label)
    ax.plot(KS, [summary["teacher"][f"pass@{k}"] * 100 for k in KS], "k--", marker="s",
            label="teacher (tiny-1m + GRPO)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k (%)")
    ax.set_title("tiny-300k student: distillation vs GRPO (95% interval over seeds)",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pass_at_k.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distill", required=True, help="the distillation sweep directory")
    parser.add_argument("--rl", required=True, help="the GRPO sweep directory")
    parser.add_argument("--rl_long", default="", help="the longer GRPO sweep (optional)")
    parser.add_argument("--teacher", required=True, help="the teacher's run directory")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    arms = {arm: {run.seed: run for run in sweep.finished_runs(root)}
            for arm, root in (("distill", args.distill), ("rl", args.rl),
                              ("rl_long", args.rl_long)) if root}
    if not all(arms.values()):
        raise SystemExit("no finished run in one of the sweep directories")
    summary = analyze(arms, args.teacher)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, args.out)
    print(text)


if __name__ == "__main__":
    main()
