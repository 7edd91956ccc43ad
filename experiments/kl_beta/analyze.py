"""The kl_beta study's analysis: held-out figures and the KL to the base model for each beta,
paired by seed against beta = 0.

Reads the finished runs of the sweep directory (`python -m grpo_jax.sweep --set rl.beta=...
--seeds=...` names each run `rl.beta=B,seed=S`) and kl.json (written by measure_kl.py),
and writes next to this file (or to --out): summary.json, table.md (the README's tables),
kl_beta.png (exact KL and the paired pass@1 difference against beta) and curves.png (the
training reward and k3 `kl_ref` over the GRPO steps, per beta).

    python experiments/kl_beta/analyze.py --sweep=runs/experiments/kl_beta/sweep

A seed's runs share the base model, the held-out problems (`task.eval_seed`), the RL prompt
order and the sampling keys, so differences are taken within a seed, with a 95% interval
over seeds (Student's t, `grpo_jax.sweep.paired_interval`); cells without "paired" are the
mean and 95% interval of the figure itself over seeds (`grpo_jax.sweep.interval`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from grpo_jax import sweep  # noqa: E402
from grpo_jax.metrics import read_metrics  # noqa: E402

EVAL = ("pass@1", "pass@8", "maj@8", "format_rate", "mean_length")
KL = ("exact_kl", "k1", "k3", "exact_kl_token_std", "k1_token_std", "k3_token_std",
      "mean_abs_1_minus_ratio", "kl_grad_weight", "mean_abs_advantage",
      "mean_abs_advantage_mixed_groups", "mixed_group_frac", "kl_weight_ratio")
PAIRED = EVAL + ("exact_kl", "k1", "k3")
PERCENT = ("pass@1", "pass@8", "maj@8", "format_rate")


def load_runs(root: str) -> dict[float, dict[int, str]]:
    """beta -> seed -> the run directory, for the finished runs."""
    runs: dict[float, dict[int, str]] = {}
    for name in sorted(os.listdir(root)):
        parts = dict(part.split("=", 1) for part in name.split(",") if "=" in part)
        path = os.path.join(root, name)
        if set(parts) == {"rl.beta", "seed"} and os.path.isfile(
                os.path.join(path, "report.json")):
            runs.setdefault(float(parts["rl.beta"]), {})[int(parts["seed"])] = path
    return runs


def run_figures(path: str, kl: dict) -> dict:
    """A run's eval_base / eval_final figures, its kl.json entry and its training curves."""
    rows = read_metrics(path)
    stages = {r["stage"]: r for r in rows if r.get("stage") in ("eval_base", "eval_final")}
    rl = [r for r in rows if r.get("stage") == "rl"]
    return {"base": stages.get("eval_base", {}), "final": stages.get("eval_final", {}),
            "kl": kl.get(os.path.basename(path), {}),
            "train_kl_ref": [r.get("kl_ref", math.nan) for r in rl],
            "train_reward": [r.get("reward_mean", math.nan) for r in rl]}


def fmt(stats: dict, scale: float = 1.0, digits: int = 4, signed: bool = False) -> str:
    if stats["n"] == 0 or not math.isfinite(stats["mean"]):
        return "-"
    mean = stats["mean"] * scale
    sign = "+" if signed else ""
    if stats["n"] < 2:
        return f"{mean:{sign}.{digits}f} (n=1)"
    half = (stats["ci95"][1] - stats["ci95"][0]) / 2 * scale
    return f"{mean:{sign}.{digits}f} ± {half:.{digits}f}"


def cell(stats: dict, name: str, signed: bool = False) -> str:
    if name in PERCENT:
        return fmt(stats, 100.0, 1, signed) + ("" if signed else "%")
    return fmt(stats, 1.0, 2 if name == "mean_length" else 4, signed)


def analyze(runs: dict[float, dict[int, str]], kl: dict) -> dict:
    betas = sorted(runs)
    if 0.0 not in runs:
        raise SystemExit("no beta = 0 run: nothing to pair against")
    figures = {b: {s: run_figures(p, kl) for s, p in runs[b].items()} for b in betas}
    seeds = sorted(runs[0.0])

    def values(beta, part, name):
        return [figures[beta].get(s, {}).get(part, {}).get(name, math.nan) for s in seeds]

    summary = {"seeds": seeds, "betas": betas, "base_model": {}, "arms": {}}
    summary["base_model"] = {name: sweep.interval(values(0.0, "base", name)) for name in EVAL}
    for beta in betas:
        arm = {"seeds": sorted(runs[beta]), "final": {}, "kl": {}, "paired_vs_beta0": {},
               "paired_vs_base_model": {}, "train_kl_ref_last10": {}}
        for name in EVAL:
            arm["final"][name] = sweep.interval(values(beta, "final", name))
            arm["paired_vs_base_model"][name] = sweep.paired_interval(
                values(beta, "final", name), values(beta, "base", name))
        for name in KL:
            arm["kl"][name] = sweep.interval(values(beta, "kl", name))
        for name in PAIRED:
            part = "kl" if name in ("exact_kl", "k1", "k3") else "final"
            arm["paired_vs_beta0"][name] = sweep.paired_interval(values(beta, part, name),
                                                                 values(0.0, part, name))
        last = []
        for s in seeds:
            series = [v for v in figures[beta].get(s, {}).get("train_kl_ref", [])[-10:]
                      if v is not None and math.isfinite(v)]
            last.append(sum(series) / len(series) if series else math.nan)
        arm["train_kl_ref_last10"] = sweep.interval(last)
        summary["arms"][str(beta)] = arm
    summary["curves"] = {str(b): {str(s): {k: figures[b][s][k]
                                           for k in ("train_kl_ref", "train_reward")}
                                  for s in figures[b]} for b in betas}
    return summary


def table(summary: dict) -> str:
    arms = summary["arms"]
    b = summary["base_model"]
    lines = [f"Base model (eval_base, the same problems, each seed's samples): pass@1 "
             f"{cell(b['pass@1'], 'pass@1')}, pass@8 {cell(b['pass@8'], 'pass@8')}, "
             f"maj@8 {cell(b['maj@8'], 'maj@8')}.", "",
             "| β | pass@1 | pass@8 | maj@8 | format rate | length (tokens) | "
             "pass@1 - base model (paired) |", "|---|---|---|---|---|---|---|"]
    for beta, arm in arms.items():
        f = arm["final"]
        lines.append(f"| {beta} | " + " | ".join(cell(f[n], n) for n in EVAL)
                     + f" | {cell(arm['paired_vs_base_model']['pass@1'], 'pass@1', True)} |")
    lines += ["", "| β − 0, paired by seed | pass@1 (points) | pass@8 | maj@8 | format rate "
              "| length | exact KL (nats/token) |", "|---|---|---|---|---|---|---|"]
    for beta, arm in arms.items():
        if float(beta) == 0.0:
            continue
        p = arm["paired_vs_beta0"]
        lines.append(f"| {beta} | " + " | ".join(cell(p[n], n, True)
                                                 for n in EVAL + ("exact_kl",)) + " |")
    lines += ["", "| β | exact KL(π ‖ base) per token | k1 | k3 | training `kl_ref` (k3, last "
              "10 steps) | per-token std: exact / k1 / k3 |", "|---|---|---|---|---|---|"]
    for beta, arm in arms.items():
        k = arm["kl"]
        stds = " / ".join(f"{k[n]['mean']:.3f}" for n in
                          ("exact_kl_token_std", "k1_token_std", "k3_token_std"))
        lines.append(f"| {beta} | {fmt(k['exact_kl'])} | {fmt(k['k1'])} | {fmt(k['k3'])} | "
                     f"{fmt(arm['train_kl_ref_last10'])} | {stds} |")
    lines += ["", "| β | E\\|1 − π_base/π\\| | β · E\\|1 − π_base/π\\| (k3 weight) | E\\|A\\| "
              "(all tokens) | E\\|A\\| (mixed groups) | groups with mixed rewards | "
              "k3 weight / E\\|A\\| |", "|---|---|---|---|---|---|---|"]
    for beta, arm in arms.items():
        k = arm["kl"]
        lines.append(f"| {beta} | {fmt(k['mean_abs_1_minus_ratio'], digits=3)} | "
                     f"{fmt(k['kl_grad_weight'], digits=4)} | "
                     f"{fmt(k['mean_abs_advantage'], digits=3)} | "
                     f"{fmt(k['mean_abs_advantage_mixed_groups'], digits=3)} | "
                     f"{fmt(k['mixed_group_frac'], 100.0, 1)}% | "
                     f"{fmt(k['kl_weight_ratio'], digits=4)} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, curves: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = summary["arms"]
    labels = list(arms)
    x = np.arange(len(labels))

    def series(get):
        means, halves = [], []
        for arm in arms.values():
            st = get(arm)
            means.append(st["mean"])
            halves.append((st["ci95"][1] - st["ci95"][0]) / 2 if st["n"] > 1 else 0.0)
        return np.asarray(means), np.nan_to_num(np.asarray(halves))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    m, h = series(lambda a: a["kl"]["exact_kl"])
    axes[0].errorbar(x, m, yerr=h, fmt="o-", capsize=4, label="exact")
    for name, style in (("k1", "s:"), ("k3", "^:")):
        mk, hk = series(lambda a, n=name: a["kl"][n])
        axes[0].errorbar(x + 0.08, mk, yerr=hk, fmt=style, capsize=3, alpha=0.6, label=name)
    axes[0].set_ylabel("KL(π ‖ base), nats per token")
    axes[0].set_title("KL of the final policy to the base (95% over seeds)", fontsize=9)
    axes[0].legend(fontsize=7)
    m, h = series(lambda a: a["paired_vs_beta0"]["pass@1"])
    axes[1].errorbar(x, m * 100, yerr=h * 100, fmt="o-", capsize=4, label="pass@1")
    m, h = series(lambda a: a["paired_vs_beta0"]["pass@8"])
    axes[1].errorbar(x + 0.08, m * 100, yerr=h * 100, fmt="s:", capsize=4, label="pass@8")
    axes[1].axhline(0, color="k", lw=0.5)
    axes[1].set_ylabel("difference from β = 0 (points)")
    axes[1].set_title("held-out, paired by seed (95%)", fontsize=9)
    axes[1].legend(fontsize=7)
    m, h = series(lambda a: a["kl"]["kl_grad_weight"])
    ma, ha = series(lambda a: a["kl"]["mean_abs_advantage"])
    axes[2].errorbar(x, m, yerr=h, fmt="o-", capsize=4, label="β·E|1 − π_base/π| (k3)")
    axes[2].errorbar(x, ma, yerr=ha, fmt="s-", capsize=4, label="E|A| (policy gradient)")
    axes[2].set_yscale("symlog", linthresh=1e-4)
    axes[2].set_title("per-token gradient weights, final policy", fontsize=9)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(x, [f"β={b}" for b in labels], fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "kl_beta.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for i, (beta, seeds) in enumerate(curves.items()):
        for ax, key in zip(axes, ("train_reward", "train_kl_ref")):
            rows = [s[key] for s in seeds.values()]
            length = min(len(r) for r in rows)
            values = np.asarray([r[:length] for r in rows], float)
            if np.all(np.isnan(values)):
                continue
            steps = np.arange(1, length + 1)
            mean = np.nanmean(values, 0)
            ax.plot(steps, mean, color=f"C{i}", label=f"β={beta}")
            ax.fill_between(steps, np.nanmin(values, 0), np.nanmax(values, 0),
                            color=f"C{i}", alpha=0.15)
    axes[0].set_title("training reward (mean over seeds, band: min-max)", fontsize=9)
    axes[1].set_title("training kl_ref (k3 on the step's rollout; β > 0 only)", fontsize=9)
    axes[1].set_yscale("log")
    axes[1].set_ylim(1e-4, None)  # the first steps' KL is ~0 (the policy is the base)
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--kl", default=os.path.join(HERE, "kl.json"),
                        help="measure_kl.py's output")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    runs = load_runs(args.sweep)
    if not runs:
        raise SystemExit(f"{args.sweep}: no finished run (report.json) found")
    kl = {}
    if os.path.isfile(args.kl):
        with open(args.kl, encoding="utf-8") as f:
            kl = json.load(f).get("runs", {})
    summary = analyze(runs, kl)
    curves = summary.pop("curves")  # per-step series: plotted, not kept in summary.json
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    text = table(summary)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    plot(summary, curves, args.out)
    print(text)


if __name__ == "__main__":
    main()
