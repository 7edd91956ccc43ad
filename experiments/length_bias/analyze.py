"""The length-bias study's analysis: GRPO against Dr. GRPO on arithmetic with redos, paired
by seed.

Reads the finished runs of a sweep directory (`--set rl.algorithm=grpo,dr_grpo --seeds=...`
names each run `rl.algorithm=A,seed=S`) and the held-out completions written by
held_out.py, and writes next to this file (or to --out): summary.json, table.md (the
README's tables) and lengths.png (length of the correct and of the incorrect training
completions over the GRPO steps, both arms).

    python experiments/length_bias/analyze.py --sweep=runs/experiments/length_bias/sweep \
        --held_out=runs/experiments/length_bias/held_out

Held-out figures: pass@1 and pass@8 are the eval stages' (metrics.jsonl); the lengths and
the redo rate are counted on all 128 x 8 completions (held_out.py: the same samples as the
eval stages). Lengths are in tokens of the char tokenizer (a character, or one of the four
tags), the end token included, as the eval's mean_length counts them. The redo rate is the
number of " redo " in the completions over the number of steps their problems need (one per
operator). Differences are taken within a seed (the same base, held-out problems and keys),
with a 95% interval over seeds (Student's t, `grpo_jax.sweep.paired_interval`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

from grpo_jax import sweep
from grpo_jax.metrics import read_metrics

ARMS = ("grpo", "dr_grpo")
STAGES = {"eval_base": "before RL", "eval_final": "after RL"}
# held-out figures: (name, label, scale, unit); the second group on the problems with two
# operators only (85% of the held-out set), where the length does not also measure the mix
# of one- and two-step problems among the correct and the incorrect completions.
FIGURES = (("pass@1", "pass@1", 100.0, "%"), ("pass@8", "pass@8", 100.0, "%"),
           ("length", "length", 1.0, ""), ("length_correct", "length, correct", 1.0, ""),
           ("length_incorrect", "length, incorrect", 1.0, ""),
           ("gap", "incorrect - correct", 1.0, ""),
           ("redo_rate", "redos per step", 100.0, "%"))
FIGURES_2STEP = (("pass@1_2step", "pass@1", 100.0, "%"),
                 ("length_correct_2step", "length, correct", 1.0, ""),
                 ("length_incorrect_2step", "length, incorrect", 1.0, ""),
                 ("gap_2step", "incorrect - correct", 1.0, ""),
                 ("redo_rate_2step", "redos per step", 100.0, "%"),
                 ("pass@1_redo_2step", "pass@1 with a redo", 100.0, "%"),
                 ("pass@1_no_redo_2step", "pass@1 without", 100.0, "%"))
CURVES = ("length_correct", "length_incorrect", "gap", "completion_length", "pass@1")
WINDOW = 10  # training steps averaged at the start and at the end
STEPS_OF = re.compile(r"[-+*]")
TAGS = re.compile(r"</?(?:think|answer)>")  # one token each under the char tokenizer
MAX_NEW_TOKENS = 48  # config.py's: a completion this long has no end token


def load_runs(root: str, arm_key: str = "rl.algorithm") -> dict[str, dict[int, str]]:
    """arm -> seed -> workdir of the sweep's finished runs (report.json written)."""
    runs: dict[str, dict[int, str]] = {}
    for name in sorted(os.listdir(root)):
        parts = dict(part.split("=", 1) for part in name.split(",") if "=" in part)
        workdir = os.path.join(root, name)
        if "seed" in parts and os.path.isfile(os.path.join(workdir, "report.json")):
            runs.setdefault(parts.get(arm_key, "base"), {})[int(parts["seed"])] = workdir
    return runs


def rl_rows(workdir: str) -> list[dict]:
    return [r for r in read_metrics(workdir) if r.get("stage") == "rl"]


def value(row: dict, name: str) -> float:
    if name == "gap":  # incorrect minus correct completions' length
        return value(row, "length_incorrect") - value(row, "length_correct")
    v = row.get(name)
    return math.nan if v is None else float(v)


def window_mean(rows: list[dict], name: str, first: bool, n: int = WINDOW) -> float:
    """Mean of `name` over the first (or last) n RL steps, NaN steps left out."""
    values = [value(r, name) for r in (rows[:n] if first else rows[-n:])]
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def problem_steps(prompt: str) -> int:
    """Steps a problem needs: one per operator of "Q: 7+5*3\\nA: " (operands are 1-9)."""
    return len(STEPS_OF.findall(prompt.split("Q:", 1)[-1].split("\n", 1)[0]))


def token_length(completion: str) -> int:
    """Tokens of a completion under the char tokenizer, the end token included (as the
    eval's mean_length and the RL metrics count them)."""
    n = len(TAGS.sub("#", completion))
    return n + (n < MAX_NEW_TOKENS)


def sample_figures(path: str, stage: str) -> dict[str, float]:
    """Length, length of the correct / incorrect completions and redo figures of every
    completion of `stage` in a samples.jsonl, over all problems and (suffix _2step) over
    the two-operator ones."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row.get("stage") == stage:
                rows.append(row)
    if not rows:
        return {}

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else math.nan

    def figures(rows, suffix=""):
        correct = [r for r in rows if r["accuracy"] >= 1.0]
        wrong = [r for r in rows if r["accuracy"] < 1.0]
        redos = [r["completion"].count(" redo ") for r in rows]
        out = {
            "length": mean(token_length(r["completion"]) for r in rows),
            "length_correct": mean(token_length(r["completion"]) for r in correct),
            "length_incorrect": mean(token_length(r["completion"]) for r in wrong),
            "redo_rate": sum(redos) / max(1, sum(problem_steps(r["prompt"]) for r in rows)),
            "with_redo": mean(n > 0 for n in redos),
            "pass@1": mean(r["accuracy"] >= 1.0 for r in rows),
            "pass@1_redo": mean(r["accuracy"] >= 1.0 for r, n in zip(rows, redos) if n),
            "pass@1_no_redo": mean(r["accuracy"] >= 1.0 for r, n in zip(rows, redos) if not n),
        }
        out["gap"] = out["length_incorrect"] - out["length_correct"]
        return {name + suffix: v for name, v in out.items()}

    out = figures(rows)
    out["pass@1_samples"] = out.pop("pass@1")  # the eval's own pass@1 is kept
    out.update(figures([r for r in rows if problem_steps(r["prompt"]) == 2], "_2step"))
    out["num_samples"] = len(rows)
    return out


def held_out_dirs(held_out: str, run_name: str) -> dict[int, str]:
    """RL step -> held_out.py's eval-only workdir for that checkpoint of a run."""
    root = os.path.join(held_out, run_name)
    if not os.path.isdir(root):
        return {}
    return {int(name.split("=", 1)[1]): os.path.join(root, name, "eval")
            for name in os.listdir(root) if name.startswith("step=")
            and os.path.isfile(os.path.join(root, name, "eval", "report.json"))}


def held_out_figures(workdir: str, held_out: str) -> dict[str, dict]:
    """eval stage -> its figures: the run's metrics (pass@k, mean_length) and the counts
    over all its completions (held_out.py's step 0 and last step)."""
    figures = {r["stage"]: dict(r) for r in read_metrics(workdir) if r.get("stage") in STAGES}
    dirs = held_out_dirs(held_out, os.path.basename(workdir))
    if dirs:
        for stage, step in (("eval_base", 0), ("eval_final", max(dirs))):
            if stage in figures and step in dirs:
                figures[stage].update(sample_figures(
                    os.path.join(dirs[step], "samples.jsonl"), stage))
    return figures


def fmt(stats: dict, scale: float = 1.0, digits: int = 1, signed: bool = False) -> str:
    if stats["n"] == 0 or not math.isfinite(stats["mean"]):
        return "-"
    mean = stats["mean"] * scale
    if stats["n"] < 2:
        return f"{mean:.{digits}f} (n=1)"
    half = (stats["ci95"][1] - stats["ci95"][0]) / 2 * scale
    return f"{mean:+.{digits}f} ± {half:.{digits}f}" if signed else \
        f"{mean:.{digits}f} ± {half:.{digits}f}"


def analyze(runs: dict[str, dict[int, str]], held_out: str) -> dict:
    arms = [a for a in ARMS if a in runs]
    seeds = sorted(set.intersection(*(set(runs[a]) for a in arms)))
    figures = {a: {s: held_out_figures(runs[a][s], held_out) for s in seeds} for a in arms}
    rows = {a: {s: rl_rows(runs[a][s]) for s in seeds} for a in arms}

    def values(arm, stage, name):
        return [figures[arm][s].get(stage, {}).get(name, math.nan) for s in seeds]

    names = [f[0] for f in FIGURES + FIGURES_2STEP] + ["with_redo", "with_redo_2step"]
    summary = {"seeds": seeds, "arms": arms, "held_out": {}, "after_minus_before": {},
               "dr_grpo_minus_grpo": {}, "training": {}, "training_dr_grpo_minus_grpo": {}}
    for arm in arms:
        summary["held_out"][arm] = {stage: {n: sweep.interval(values(arm, stage, n))
                                            for n in names + ["mean_length"]}
                                    for stage in STAGES}
        summary["after_minus_before"][arm] = {
            n: sweep.paired_interval(values(arm, "eval_final", n), values(arm, "eval_base", n))
            for n in names}
    if len(arms) == 2:
        a, b = "dr_grpo", "grpo"
        summary["dr_grpo_minus_grpo"] = {
            n: sweep.paired_interval(values(a, "eval_final", n), values(b, "eval_final", n))
            for n in names}
    for arm in arms:
        summary["training"][arm] = {}
        for name in CURVES:
            first = [window_mean(rows[arm][s], name, True) for s in seeds]
            last = [window_mean(rows[arm][s], name, False) for s in seeds]
            summary["training"][arm][name] = {
                "first_10": sweep.interval(first), "last_10": sweep.interval(last),
                "change": sweep.paired_interval(last, first),
                "per_seed_change": [x - y for x, y in zip(last, first)]}
    if len(arms) == 2:
        for name in CURVES:
            summary["training_dr_grpo_minus_grpo"][name] = sweep.paired_interval(
                summary["training"]["dr_grpo"][name]["per_seed_change"],
                summary["training"]["grpo"][name]["per_seed_change"])
    summary["steps"] = {a: [len(rows[a][s]) for s in seeds] for a in arms}
    return summary


def table(summary: dict) -> str:
    n_seeds = len(summary["seeds"])
    lines = []
    for group, title in ((FIGURES, "held-out, all problems"),
                         (FIGURES_2STEP, "held-out, two-operator problems")):
        heads = [label for _, label, _, _ in group]
        lines += [f"| {title} (128 x 8 samples, {n_seeds} seeds) | " + " | ".join(heads)
                  + " |", "|---" * (len(heads) + 1) + "|"]
        for arm in summary["arms"]:
            for stage, label in STAGES.items():
                if stage == "eval_base" and arm != summary["arms"][0]:
                    continue  # the same samples in both arms (same base, seed and keys)
                c = summary["held_out"][arm][stage]
                name = "base (both arms)" if stage == "eval_base" else f"{arm}, {label}"
                lines.append(f"| {name} | " + " | ".join(
                    fmt(c[n], s) + u for n, _, s, u in group) + " |")
        contrasts = [(f"{arm}: after - before (paired)", summary["after_minus_before"][arm])
                     for arm in summary["arms"]]
        if summary["dr_grpo_minus_grpo"]:
            contrasts.append(("after: dr_grpo - grpo (paired)", summary["dr_grpo_minus_grpo"]))
        for label, stats in contrasts:
            lines.append(f"| {label} | " + " | ".join(
                fmt(stats[n], s, signed=True) + (" pt" if u else "") for n, _, s, u in group)
                + " |")
        lines.append("")
    lines += ["| training rollouts | arm | first 10 steps | last 10 steps | "
              "change (paired) |", "|---|---|---|---|---|"]
    for name in CURVES:
        scale = 100.0 if name == "pass@1" else 1.0
        label = "incorrect - correct" if name == "gap" else name
        for arm in summary["arms"]:
            t = summary["training"][arm][name]
            lines.append(f"| {label} | {arm} | {fmt(t['first_10'], scale)} | "
                         f"{fmt(t['last_10'], scale)} | {fmt(t['change'], scale, signed=True)} |")
        if summary["training_dr_grpo_minus_grpo"]:
            d = summary["training_dr_grpo_minus_grpo"][name]
            lines.append(f"| {label} | change: dr_grpo - grpo | | | "
                         f"{fmt(d, scale, signed=True)} |")
    return "\n".join(lines) + "\n"


def curve(workdirs, name: str):
    """(steps, mean, std) of a training metric over seeds (NaN steps left out)."""
    import numpy as np

    series = [[value(r, name) for r in rl_rows(w)] for w in workdirs]
    length = min(len(s) for s in series)
    values = np.asarray([s[:length] for s in series], float)
    return np.arange(1, length + 1), np.nanmean(values, 0), np.nanstd(values, 0)


def smooth(values, width: int = 5):
    import numpy as np

    kernel = np.ones(width) / width
    padded = np.pad(values, (width // 2, width - 1 - width // 2), mode="edge")
    return np.convolve(padded, kernel, mode="valid")


def plot(runs, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, name in zip(axes, ("length_correct", "length_incorrect")):
        for color, arm in zip(("C0", "C3"), ARMS):
            if arm not in runs:
                continue
            steps, mean, std = curve(runs[arm].values(), name)
            mean, std = smooth(mean), smooth(std)
            ax.plot(steps, mean, color=color, label=arm)
            ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
        ax.set_xlabel("GRPO step")
        ax.set_title(f"{name.replace('_', ', ')} completions (training rollouts)", fontsize=9)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("length (tokens)")
    fig.suptitle("mean ± std over seeds, 5-step moving average", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "lengths.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--held_out", required=True, help="held_out.py's --out")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = load_runs(args.sweep)
    if not runs:
        raise SystemExit(f"{args.sweep}: no finished run (report.json) found")
    summary = analyze(runs, args.held_out)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = table(summary)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    plot(runs, args.out)
    print(text)


if __name__ == "__main__":
    main()
