"""The pass@k study's analysis: base and RL pass@k curves up to k = 256, paired by seed.

Reads the finished eval-only runs of `run.py` (`<root>/model=M,seed=S`, M = base or rl) and
writes next to this file (or to --out): summary.json, table.md (the README's table) and
pass_at_k.png (pass@k against k on a log2 axis for both models with 95% bands, and the
paired difference RL - base at each k with its 95% band).

    python experiments/pass_at_k/analyze.py --root=runs/experiments/pass_at_k

Every difference is model=rl,seed=S minus model=base,seed=S (the same 128 held-out problems,
the same sampling keys), with a 95% interval over the seeds (Student's t,
`grpo_jax.sweep.paired_interval`); each curve's interval is `grpo_jax.sweep.interval` over
the seeds. pass@k is the unbiased estimator of Chen et al. 2021 from the 256 samples per
problem (at k = 256 it is the share of problems with at least one correct sample).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from grpo_jax import sweep

HERE = os.path.dirname(os.path.abspath(__file__))

KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MODELS = ("base", "rl")


def load_runs(root: str) -> dict[str, dict[int, sweep.Run]]:
    """{model: {seed: finished run}} of the directories `model=M,seed=S` under root."""
    runs: dict[str, dict[int, sweep.Run]] = {}
    for run in sweep.finished_runs(root):
        if [key for key, _ in run.overrides] == ["model"]:
            runs.setdefault(run.overrides[0][1], {})[run.seed] = run
    return runs


def wall_time(run: sweep.Run) -> float:
    path = os.path.join(run.workdir, "wall_s.json")
    if not os.path.exists(path):
        return math.nan
    with open(path, encoding="utf-8") as f:
        return float(json.load(f)["wall_s"])


def crossing(ks, diffs) -> dict:
    """Where the mean paired difference changes sign: the first k with a sign opposite to
    k = 1's, and the crossing interpolated linearly in log2 k between it and the k before."""
    signs = [math.copysign(1, d) if d else 0 for d in diffs]
    for i in range(1, len(ks)):
        if signs[i] and signs[0] and signs[i] != signs[0]:
            a, b = diffs[i - 1], diffs[i]
            x0, x1 = math.log2(ks[i - 1]), math.log2(ks[i])
            x = x0 + (x1 - x0) * a / (a - b) if a != b else x0
            return {"first_k_with_other_sign": ks[i], "k_before": ks[i - 1],
                    "interpolated_k": 2 ** x}
    return {"first_k_with_other_sign": None}


def analyze(runs) -> dict:
    seeds = sorted(set(runs.get("base", {})) & set(runs.get("rl", {})))
    figures = {m: {s: sweep.final_figures(r) for s, r in members.items()}
               for m, members in runs.items()}
    summary: dict = {"seeds_paired": seeds, "ks": list(KS), "models": {},
                     "paired_rl_minus_base": {}}
    for model in MODELS:
        members = sorted(runs.get(model, {}))
        entry = {"seeds": members, "pass@k": {}, "maj@k": {}, "per_seed_pass@k": {},
                 "wall_s": {str(s): wall_time(runs[model][s]) for s in members}}
        for k in KS:
            values = [figures[model][s].get(f"pass@{k}") for s in members]
            entry["pass@k"][str(k)] = sweep.interval(values)
            entry["per_seed_pass@k"][str(k)] = values
            if k > 1:
                entry["maj@k"][str(k)] = sweep.interval(
                    [figures[model][s].get(f"maj@{k}") for s in members])
        for name in ("format_rate", "mean_length"):
            entry[name] = sweep.interval([figures[model][s].get(name) for s in members])
        summary["models"][model] = entry
    for k in KS:
        name = f"pass@{k}"
        summary["paired_rl_minus_base"][str(k)] = sweep.paired_interval(
            [figures["rl"][s].get(name) for s in seeds],
            [figures["base"][s].get(name) for s in seeds])
    for k in KS[1:]:
        name = f"maj@{k}"
        summary["paired_rl_minus_base"][f"maj@{k}"] = sweep.paired_interval(
            [figures["rl"][s].get(name) for s in seeds],
            [figures["base"][s].get(name) for s in seeds])
    diffs = [summary["paired_rl_minus_base"][str(k)]["mean"] for k in KS]
    summary["sign_change"] = crossing(KS, diffs)
    summary["resolved"] = {  # the paired 95% interval leaves out 0
        str(k): ("rl > base" if s["ci95"][0] > 0 else "rl < base" if s["ci95"][1] < 0
                 else "within noise")
        for k in KS for s in [summary["paired_rl_minus_base"][str(k)]]}
    return summary


def table(summary: dict) -> str:
    pct = sweep.format_interval
    base, rl = summary["models"]["base"], summary["models"]["rl"]
    paired = summary["paired_rl_minus_base"]
    lines = [("| k | base pass@k | RL pass@k | RL - base, paired | paired 95% interval | "
             "base maj@k | RL maj@k |"),
             "|---|---|---|---|---|---|---|"]
    for k in KS:
        p = paired[str(k)]
        interval = (f"[{p['ci95'][0] * 100:+.1f}, {p['ci95'][1] * 100:+.1f}] "
                    f"({summary['resolved'][str(k)]})" if p["n"] > 1 else "-")
        maj = (pct(base["maj@k"][str(k)]) + "%", pct(rl["maj@k"][str(k)]) + "%") if k > 1 \
            else ("-", "-")
        lines.append(f"| {k} | {pct(base['pass@k'][str(k)])}% | {pct(rl['pass@k'][str(k)])}% | "
                     f"{pct(p, signed=True)} points | {interval} | {maj[0]} | {maj[1]} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ks = np.array(KS)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    for model, color, label in (("base", "C0", "base (pretrained)"),
                                ("rl", "C3", "RL (60 GRPO steps)")):
        stats = [summary["models"][model]["pass@k"][str(k)] for k in KS]
        mean = np.array([s["mean"] for s in stats]) * 100
        low = np.array([s["ci95"][0] for s in stats]) * 100
        high = np.array([s["ci95"][1] for s in stats]) * 100
        ax.plot(ks, mean, marker="o", color=color, label=label)
        ax.fill_between(ks, low, high, color=color, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in KS])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k (%)")
    ax.set_title("held-out pass@k, mean over 3 seeds, 95% band", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    stats = [summary["paired_rl_minus_base"][str(k)] for k in KS]
    mean = np.array([s["mean"] for s in stats]) * 100
    low = np.array([s["ci95"][0] for s in stats]) * 100
    high = np.array([s["ci95"][1] for s in stats]) * 100
    ax.plot(ks, mean, marker="o", color="C2")
    ax.fill_between(ks, low, high, color="C2", alpha=0.25)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in KS])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("RL - base, same seed (points)")
    ax.set_title("paired difference, 95% band", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pass_at_k.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join("runs", "experiments", "pass_at_k"))
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = load_runs(args.root)
    if not runs.get("base") or not runs.get("rl"):
        raise SystemExit(f"{args.root}: needs finished model=base and model=rl runs")
    summary = analyze(runs)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, args.out)
    print(text)
    print("sign change:", summary["sign_change"])


if __name__ == "__main__":
    main()
