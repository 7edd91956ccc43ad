"""The budget-forcing study's analysis: held-out pass@1 and length per thinking budget,
paired by seed against no forcing.

Reads the finished eval-only runs of `run.py` (`<root>/eval_final.<field>=<v>,seed=S`) and
writes next to this file (or to --out): summary.json, table.md (the README's table) and
budget_forcing.png (pass@1, mean completion length and format rate against the thinking
budget: the caps (max_thinking_tokens) and the minima with "Wait" (min_thinking_tokens) as
paired differences to no forcing, with 95% intervals).

    python experiments/budget_forcing/analyze.py --root=runs/experiments/budget_forcing

Every difference is arm minus no forcing for the same seed (the same RL model, the same 128
held-out problems, the same sampling keys), with a 95% interval over seeds (Student's t,
`grpo_jax.sweep.paired_interval`). summary.json also keeps the completions each run logged
(samples.jsonl: the first 4), to show what the forced traces look like.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from grpo_jax import sweep

HERE = os.path.dirname(os.path.abspath(__file__))

FIGURES = ("pass@1", "pass@8", "maj@8", "format_rate", "mean_length")
NONE = ("none", 0)


def arm_of(run: sweep.Run) -> tuple[str, int]:
    """("none", 0), ("max", N) or ("min", N)."""
    (key, value), = run.overrides
    value = int(value)
    if value == 0:
        return NONE
    return ("max" if key.endswith("max_thinking_tokens") else "min"), value


def label(arm: tuple[str, int], continuation: str = "Wait") -> str:
    kind, value = arm
    return {"none": "no forcing", "max": f"cap: at most {value} thinking tokens",
            "min": f'at least {value} thinking tokens ("{continuation}")'}[kind]


def continuation_of(run: sweep.Run) -> str:
    """The run's forced continuation (its config.json's eval_final.continuation)."""
    with open(os.path.join(run.workdir, "config.json"), encoding="utf-8") as f:
        return json.load(f)["eval_final"]["continuation"]


def load_runs(root: str) -> dict[tuple[str, int], dict[int, sweep.Run]]:
    runs: dict[tuple[str, int], dict[int, sweep.Run]] = {}
    for run in sweep.finished_runs(root):
        if len(run.overrides) == 1:
            runs.setdefault(arm_of(run), {})[run.seed] = run
    return runs


def wall_time(run: sweep.Run) -> float:
    path = os.path.join(run.workdir, "wall_s.json")
    if not os.path.exists(path):
        return math.nan
    with open(path, encoding="utf-8") as f:
        return float(json.load(f)["wall_s"])


def examples(run: sweep.Run) -> list[str]:
    path = os.path.join(run.workdir, "samples.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [f"{' '.join(r['prompt'].split())} -> {r['completion']} "
            f"({'correct' if r.get('accuracy', 0) >= 1 else 'wrong'}, "
            f"{'formatted' if r.get('format', 0) >= 1 else 'malformed'})" for r in rows]


def order(arm: tuple[str, int]) -> tuple[int, int]:
    return ({"max": 0, "none": 1, "min": 2}[arm[0]], arm[1])


def analyze(runs) -> dict:
    figures = {arm: {s: sweep.final_figures(r) for s, r in members.items()}
               for arm, members in runs.items()}
    base = figures.get(NONE, {})
    summary = {}
    for arm in sorted(runs, key=order):
        seeds = sorted(runs[arm])
        entry = {"label": label(arm, continuation_of(runs[arm][seeds[0]])), "kind": arm[0],
                 "budget": arm[1], "seeds": seeds,
                 "figures": {}, "paired_vs_none": {},
                 "wall_s": {str(s): wall_time(runs[arm][s]) for s in seeds},
                 "examples_seed0": examples(runs[arm][seeds[0]])}
        for name in FIGURES:
            values = [figures[arm][s].get(name) for s in seeds]
            entry["figures"][name] = sweep.interval(values)
            entry["figures"][name]["per_seed"] = values
            if base and arm != NONE:
                entry["paired_vs_none"][name] = sweep.paired_interval(
                    values, [base.get(s, {}).get(name) for s in seeds])
        summary[f"{arm[0]}={arm[1]}" if arm != NONE else "none"] = entry
    return summary


def verdict(stats: dict) -> str:
    if stats["n"] < 2:
        return ""
    return (" (up)" if stats["ci95"][0] > 0 else " (down)" if stats["ci95"][1] < 0
            else " (noise)")


def table(summary: dict) -> str:
    fmt = sweep.format_interval
    lines = [("| forcing | seeds | pass@1 | pass@1 - none (paired) | mean length (tokens) | "
             "length - none (paired) | format rate | pass@8 |"),
             "|---|---|---|---|---|---|---|---|"]
    for entry in summary.values():
        paired = entry["paired_vs_none"]
        f = entry["figures"]
        d1 = (fmt(paired["pass@1"], 100, 1, True) + verdict(paired["pass@1"])
              if "pass@1" in paired else "-")
        dl = (fmt(paired["mean_length"], 1, 1, True) if "mean_length" in paired else "-")
        lines.append(f"| {entry['label']} | {len(entry['seeds'])} | "
                     f"{fmt(f['pass@1'], 100, 1)}% | {d1} | {fmt(f['mean_length'], 1, 1)} | "
                     f"{dl} | {fmt(f['format_rate'], 100, 1)}% | {fmt(f['pass@8'], 100, 1)}% |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    none = summary.get("none")
    for ax, name, scale, ylabel in (
            (axes[0], "pass@1", 100, "pass@1 (%)"),
            (axes[1], "mean_length", 1, "mean completion length (tokens)"),
            (axes[2], "format_rate", 100, "format rate (%)")):
        if none:
            s = none["figures"][name]
            ax.axhline(s["mean"] * scale, color="gray", lw=1, ls="--",
                       label="no forcing (95% band)")
            if s["n"] > 1:
                ax.axhspan(s["ci95"][0] * scale, s["ci95"][1] * scale, color="gray", alpha=0.15)
        forced = [e["label"].split("(")[-1].rstrip(")") for e in summary.values()
                  if e["kind"] == "min"]
        for kind, color, text in (("max", "C0", "max_thinking_tokens (cap)"),
                                  ("min", "C3", "min_thinking_tokens + "
                                   + (forced[0] if forced else ""))):
            entries = [e for e in summary.values() if e["kind"] == kind]
            if not entries:
                continue
            x = np.array([e["budget"] for e in entries])
            stats = [e["figures"][name] for e in entries]
            mean = np.array([s["mean"] for s in stats]) * scale
            err = np.array([(s["ci95"][1] - s["ci95"][0]) / 2 if s["n"] > 1 else 0
                            for s in stats]) * scale
            ax.errorbar(x, mean, yerr=err, marker="o", capsize=3, color=color, label=text)
        ax.set_xlabel("thinking budget (tokens, <think> included)")
        ax.set_ylabel(ylabel)
    axes[0].set_title("held-out pass@1 (3 RL models, mean, 95% interval)", fontsize=10)
    axes[1].set_title("completion length", fontsize=10)
    axes[2].set_title("well-formed completions", fontsize=10)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "budget_forcing.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join("runs", "experiments", "budget_forcing"))
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = load_runs(args.root)
    if not runs:
        raise SystemExit(f"{args.root}: no finished run (report.json) found")
    summary = analyze(runs)
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, args.out)
    print(text)


if __name__ == "__main__":
    main()
