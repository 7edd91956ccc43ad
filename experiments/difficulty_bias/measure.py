"""The difficulty-bias study: how much of the update GRPO's std normalisation puts on
prompts that are nearly always solved or nearly never, against Dr. GRPO's unscaled
advantages.

For each seed: 128 held-out problems (the test split, `task.examples("test", 128,
seed=S)`), a group of G = 16 completions of each sampled by the base model at temperature
1 (key S), scored with the task's accuracy reward (binary: the closed forms need it); p is
the group's pass rate. Per group, with the library's advantages (`losses.group_advantages`:
GRPO scale="group", the unbiased std plus 1e-6; Dr. GRPO scale="none"):

* the advantage weight sum_i |A_i|, and its closed form for binary rewards:
  2 G p (1 - p) for Dr. GRPO, and 2 G p (1 - p) / (s + eps) for GRPO with s the group's
  unbiased std sqrt(G / (G - 1) p (1 - p)), i.e. 2 G sqrt(p (1 - p)) sqrt((G - 1) / G):
  the ratio GRPO / Dr. GRPO is 1 / s, about 1 / sqrt(p (1 - p));
* the norm of the group's gradient contribution ||sum_i A_i g_i||, g_i = grad log pi(y_i
  | x) (`rl.update.sequence_score_grads`, the sequence's summed log-probs: no length
  normalisation), from the group's Gram matrix K_ij = <g_i, g_j>: sqrt(A^T K A); and
  its "independent gradients" approximation sqrt(sum_i A_i^2 ||g_i||^2) (K's diagonal).

Each method's weights are summed by bin of p: (0, 0.25], (0.25, 0.75), [0.75, 1) (groups
with p = 0 or 1 weigh 0 under both), as shares of the method's total. Intervals: 95% over
the 3 seeds (Student's t); GRPO against Dr. GRPO paired by seed.

    python experiments/difficulty_bias/measure.py            # sample, measure, analyse
    python experiments/difficulty_bias/measure.py --reuse    # analyse the saved groups again

Writes runs/experiments/difficulty_bias/seed=S.npz (rewards, lengths, Gram matrices) and,
next to this file, summary.json, table.md and weights.png.
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

import numpy as np

from grpo_jax import sweep

BINS = (("(0, 0.25]", lambda p: (p > 0) & (p <= 0.25)),
        ("(0.25, 0.75)", lambda p: (p > 0.25) & (p < 0.75)),
        ("[0.75, 1)", lambda p: (p >= 0.75) & (p < 1)))
METHODS = ("grpo", "dr_grpo")
MEASURES = ("abs_adv", "closed_form", "grad_norm", "grad_norm_diag")
MEASURE_LABELS = {"abs_adv": "sum abs(A)", "closed_form": "sum abs(A), closed form",
                  "grad_norm": "‖sum A g‖", "grad_norm_diag": "sqrt(sum A² ‖g‖²)"}
PLOT_LABELS = {"abs_adv": "Σ|A|", "grad_norm": "‖Σ A g‖", "grad_norm_diag": "sqrt(Σ A² ‖g‖²)"}
EPS = 1e-6


# ------------------------------------------------------------------------------ sampling
def setup(base: str):
    """The base run's task, tokenizer, policy and parameters, built as the run built them."""
    from grpo_jax.runner.inputs import load_finished_run

    try:
        run = load_finished_run(base)
    except FileNotFoundError as err:
        raise SystemExit(f"{err}; run the off_policy study's base command first "
                         "(experiments/off_policy/README.md)") from None
    return {"config": run.config, "task": run.task, "tokenizer": run.tokenizer,
            "policy": run.policy, "params": run.params,
            "prompt_len": int(run.config.task.prompt_len)}


def grad_fn(s):
    """jit(tokens, attention, loss_mask) -> [rows, P] flattened score functions."""
    import jax

    from grpo_jax.rl.update import flat_sequence_score_grads

    policy, params, prompt_len = s["policy"], s["params"], s["prompt_len"]
    return jax.jit(lambda tokens, attention, loss_mask: flat_sequence_score_grads(
        policy, params, tokens, attention, prompt_len, loss_mask=loss_mask))


def collect(s, seed: int, num_prompts: int, group: int, prompts_per_call: int) -> dict:
    """A group of `group` completions of each of `num_prompts` held-out problems: rewards
    [n, G], lengths and each group's Gram matrix [n, G, G]."""
    import jax

    from grpo_jax import tasks as tasks_lib
    from grpo_jax.rl.rollout import rollout
    from grpo_jax.sampling import SamplingConfig

    config, task, tokenizer = s["config"], s["task"], s["tokenizer"]
    examples = task.examples("test", num_prompts, seed=seed)
    sampling = SamplingConfig(max_new_tokens=int(config.rl.max_new_tokens), temperature=1.0,
                              eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id,
                              prompt_group=group)
    fn = s.setdefault("grad_fn", grad_fn(s))  # compiled once for every seed
    key = jax.random.key(seed)
    out = {"accuracy": [], "format": [], "lengths": [], "gram": [], "texts": [],
           "ids": [ex.id for ex in examples]}
    for start in range(0, num_prompts, prompts_per_call):
        chunk = examples[start:start + prompts_per_call]
        rows = [ex for ex in chunk for _ in range(group)]
        prompts = [tasks_lib.apply_template(ex, template=config.task.template,
                                            tokenizer=tokenizer) for ex in rows]
        key, sub = jax.random.split(key)
        ro = rollout(s["policy"], s["params"], tokenizer, rows, prompts, sub,
                     sampling=sampling, prompt_len=s["prompt_len"],
                     reward_fns=task.reward_fns(), weights={"accuracy": 1.0, "format": 1.0})
        full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
        attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)
        for p in range(len(chunk)):
            block = slice(p * group, (p + 1) * group)
            grads = np.asarray(fn(full[block], attention[block], ro.loss_mask[block]))
            out["gram"].append((grads @ grads.T).astype(np.float64))
        n = len(chunk)
        out["accuracy"].append(ro.components["accuracy"].reshape(n, group))
        out["format"].append(ro.components["format"].reshape(n, group))
        out["lengths"].append(ro.lengths.reshape(n, group))
        out["texts"] += ro.texts
        print(f"  seed {seed}: {start + n}/{num_prompts} prompts", flush=True)
    data = {k: np.concatenate(v) if k in ("accuracy", "format", "lengths") else v
            for k, v in out.items()}
    data["gram"] = np.stack(out["gram"])
    return data


# ------------------------------------------------------------------------------ analysis
def group_weights(acc: np.ndarray, gram: np.ndarray) -> dict:
    """Per group and method, the weights of MEASURES ([n] each) and the pass rates."""
    import jax.numpy as jnp

    from grpo_jax import losses

    n, G = acc.shape
    p = acc.mean(1)
    flat = jnp.asarray(acc.reshape(-1), jnp.float32)
    adv = {"grpo": np.asarray(losses.group_advantages(flat, group_size=G, scale="group",
                                                      eps=EPS), np.float64).reshape(n, G),
           "dr_grpo": np.asarray(losses.group_advantages(flat, group_size=G, scale="none"),
                                 np.float64).reshape(n, G)}
    std = np.sqrt(G / (G - 1) * p * (1 - p))
    closed = {"dr_grpo": 2 * G * p * (1 - p), "grpo": 2 * G * p * (1 - p) / (std + EPS)}
    diag = np.einsum("kii->ki", gram)
    out = {"p": p}
    for m in METHODS:
        a = adv[m]
        out[m] = {"abs_adv": np.abs(a).sum(1), "closed_form": closed[m],
                  "grad_norm": np.sqrt(np.maximum(np.einsum("ki,kij,kj->k", a, gram, a), 0)),
                  "grad_norm_diag": np.sqrt((a ** 2 * diag).sum(1))}
    out["closed_form_gap"] = max(float(np.max(np.abs(out[m]["abs_adv"] - closed[m])))
                                 for m in METHODS)
    # how aligned a group's score functions are: the off-diagonal share of ||sum A g||^2
    a = adv["dr_grpo"]
    full = np.einsum("ki,kij,kj->k", a, gram, a)
    out["offdiag_share"] = float(np.sum(full - (a ** 2 * diag).sum(1)) / np.sum(full))
    return out


def seed_figures(data: dict) -> dict:
    acc = np.asarray(data["accuracy"], np.float64)
    w = group_weights(acc, np.asarray(data["gram"], np.float64))
    p = w["p"]
    fig = {"prompts": len(p), "p0": float(np.mean(p == 0)), "p1": float(np.mean(p == 1)),
           "pass@1": float(acc.mean()), "closed_form_gap": w["closed_form_gap"],
           "offdiag_share": w["offdiag_share"], "bins": {}}
    for name, inside in BINS:
        mask = inside(p)
        entry = {"prompt_share": float(mask.sum() / max(((p > 0) & (p < 1)).sum(), 1)),
                 "prompts": int(mask.sum())}
        for m in METHODS:
            for measure in MEASURES:
                entry[f"{m}/{measure}"] = float(w[m][measure][mask].sum()
                                                / w[m][measure].sum())
        fig["bins"][name] = entry
    # GRPO's share over Dr. GRPO's in a bin, relative to the same ratio in the middle bin:
    # how much more weight per unit the std puts there (1 / s, s the group's std, per group)
    mid = fig["bins"]["(0.25, 0.75)"]
    fig["upweight"] = {name: {measure: (entry[f"grpo/{measure}"] / entry[f"dr_grpo/{measure}"])
                              / (mid[f"grpo/{measure}"] / mid[f"dr_grpo/{measure}"])
                              for measure in MEASURES}
                       for name, entry in fig["bins"].items()}
    extreme = lambda m, measure: sum(fig["bins"][b][f"{m}/{measure}"]  # noqa: E731
                                     for b in ("(0, 0.25]", "[0.75, 1)"))
    fig["extreme"] = {f"{m}/{measure}": extreme(m, measure) for m in METHODS
                      for measure in MEASURES}
    # per-group weight against p: fit weight ∝ (p (1 - p))^gamma over groups with 0 < p < 1
    mixed = (p > 0) & (p < 1)
    x = np.log(p[mixed] * (1 - p[mixed]))
    fig["gamma"] = {f"{m}/{measure}": float(np.polyfit(x, np.log(w[m][measure][mixed]), 1)[0])
                    for m in METHODS for measure in MEASURES}
    ks = np.arange(1, acc.shape[1])
    fig["by_k"] = {f"{m}/{measure}": [float(w[m][measure][np.isclose(p * acc.shape[1], k)]
                                             .mean()) if np.isclose(p * acc.shape[1], k).any()
                                       else math.nan for k in ks]
                   for m in METHODS for measure in MEASURES}
    fig["count_by_k"] = [int(np.isclose(p * acc.shape[1], k).sum()) for k in ks]
    return fig


def summarize(per_seed: dict) -> dict:
    seeds = sorted(per_seed)
    figs = [per_seed[s] for s in seeds]
    summary = {"seeds": seeds, "bins": {}, "extreme": {}, "extreme_paired": {}, "gamma": {}}
    for name, _ in BINS:
        keys = figs[0]["bins"][name].keys()
        summary["bins"][name] = {k: sweep.interval([f["bins"][name][k] for f in figs])
                                 for k in keys}
        summary["bins"][name]["paired"] = {
            measure: sweep.paired_interval([f["bins"][name][f"grpo/{measure}"] for f in figs],
                                           [f["bins"][name][f"dr_grpo/{measure}"]
                                            for f in figs])
            for measure in MEASURES}
    summary["upweight"] = {name: {measure: sweep.interval([f["upweight"][name][measure]
                                                            for f in figs])
                                  for measure in MEASURES} for name, _ in BINS}
    for key in figs[0]["extreme"]:
        summary["extreme"][key] = sweep.interval([f["extreme"][key] for f in figs])
        summary["gamma"][key] = sweep.interval([f["gamma"][key] for f in figs])
    for measure in MEASURES:
        summary["extreme_paired"][measure] = sweep.paired_interval(
            [f["extreme"][f"grpo/{measure}"] for f in figs],
            [f["extreme"][f"dr_grpo/{measure}"] for f in figs])
    for k in ("p0", "p1", "pass@1", "closed_form_gap", "offdiag_share"):
        summary[k] = sweep.interval([f[k] for f in figs])
    with warnings.catch_warnings():  # a pass rate no seed saw: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        summary["by_k"] = {key: np.nanmean([f["by_k"][key] for f in figs], 0).tolist()
                           for key in figs[0]["by_k"]}
    summary["count_by_k"] = np.sum([f["count_by_k"] for f in figs], 0).tolist()
    return summary


def table(summary: dict) -> str:
    fmt = sweep.format_interval
    lines = ["Share of each method's total weight by bin of the group pass rate p (%, mean "
             "± 95% interval over seeds; groups with p = 0 or 1 weigh 0):", "",
             "| p | groups (share of 0 < p < 1) | GRPO sum abs(A) | Dr. GRPO sum abs(A) | "
             "GRPO, closed form | Dr. GRPO, closed form | GRPO ‖sum A g‖ | "
             "Dr. GRPO ‖sum A g‖ | GRPO - Dr. GRPO, sum abs(A) (paired) | "
             "GRPO - Dr. GRPO, ‖sum A g‖ (paired) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary["bins"].items():
        lines.append(
            f"| {name} | {fmt(entry['prompt_share'])} | {fmt(entry['grpo/abs_adv'])} | "
            f"{fmt(entry['dr_grpo/abs_adv'])} | {fmt(entry['grpo/closed_form'])} | "
            f"{fmt(entry['dr_grpo/closed_form'])} | {fmt(entry['grpo/grad_norm'])} | "
            f"{fmt(entry['dr_grpo/grad_norm'])} | "
            f"{fmt(entry['paired']['abs_adv'], signed=True)} | "
            f"{fmt(entry['paired']['grad_norm'], signed=True)} |")
    ext, pair = summary["extreme"], summary["extreme_paired"]
    lines.append(
        f"| (0, 0.25] and [0.75, 1) | - | {fmt(ext['grpo/abs_adv'])} | "
        f"{fmt(ext['dr_grpo/abs_adv'])} | {fmt(ext['grpo/closed_form'])} | "
        f"{fmt(ext['dr_grpo/closed_form'])} | {fmt(ext['grpo/grad_norm'])} | "
        f"{fmt(ext['dr_grpo/grad_norm'])} | {fmt(pair['abs_adv'], signed=True)} | "
        f"{fmt(pair['grad_norm'], signed=True)} |")
    G = summary["settings"]["group"]
    inv = lambda p: 1 / math.sqrt(G / (G - 1) * p * (1 - p))  # noqa: E731
    ranges = {"(0, 0.25]": (1, G // 4), "(0.25, 0.75)": (G // 4 + 1, 3 * G // 4 - 1),
              "[0.75, 1)": (3 * G // 4, G - 1)}
    lines += ["", "How much more weight per unit of Dr. GRPO's the std gives a bin: (GRPO share / "
              "Dr. GRPO share) over the same ratio in the middle bin (per group the factor is "
              f"exactly 1 / s, s = sqrt(G/(G-1) p (1 - p)) + eps, G = {G}):", "",
              "| p | sum abs(A) | ‖sum A g‖ | 1 / s over the bin's pass rates |",
              "|---|---|---|---|"]
    for name, (lo, hi) in ranges.items():
        values = sorted({round(inv(k / G), 2) for k in range(lo, hi + 1)})
        lines.append(f"| {name} | {fmt(summary['upweight'][name]['abs_adv'], 1, 2)} | "
                     f"{fmt(summary['upweight'][name]['grad_norm'], 1, 2)} | "
                     f"{values[0]:.2f} to {values[-1]:.2f} |")
    g = summary["gamma"]
    lines += ["", "Per-group weight against the pass rate, fitted as (p (1 - p))^gamma over "
              "the groups with 0 < p < 1 (closed forms: sum abs(A) gamma = 1 for Dr. GRPO, 1/2 "
              "for GRPO; ‖sum A g‖ with independent equal-norm score functions: 1/2 and 0):", "",
              "| measure | GRPO gamma | Dr. GRPO gamma |", "|---|---|---|"]
    for measure in MEASURES:
        lines.append(f"| {MEASURE_LABELS[measure]} | {fmt(g['grpo/' + measure], 1, 2)} | "
                     f"{fmt(g['dr_grpo/' + measure], 1, 2)} |")
    lines += ["", "| quantity | value |", "|---|---|",
              f"| pass@1 of the samples | {fmt(summary['pass@1'])}% |",
              f"| groups with p = 0 / p = 1 | {fmt(summary['p0'])}% / {fmt(summary['p1'])}% |",
              f"| max abs(sum abs(A) - closed form) over groups | "
              f"{summary['closed_form_gap']['mean']:.2e} |",
              f"| off-diagonal share of ‖sum A g‖² (Dr. GRPO; 0: independent score "
              f"functions) | {fmt(summary['offdiag_share'])}% |"]
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: str, group: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ks = np.arange(1, group)
    p = ks / group
    middle = (p > 0.25) & (p < 0.75)
    counts = np.asarray(summary["count_by_k"])
    styles = {"grpo": "-", "dr_grpo": "--"}
    colors = {"abs_adv": "C0", "grad_norm": "C1", "grad_norm_diag": "C2"}
    for m in METHODS:
        for measure in ("abs_adv", "grad_norm", "grad_norm_diag"):
            y = np.asarray(summary["by_k"][f"{m}/{measure}"])
            norm = np.nansum(y[middle] * counts[middle]) / counts[middle].sum()
            ax.plot(p, y / norm, styles[m], marker="o", ms=3, color=colors[measure],
                    label=f"{'GRPO' if m == 'grpo' else 'Dr. GRPO'}: {PLOT_LABELS[measure]}")
    for m, curve in (("grpo", np.sqrt(p * (1 - p))), ("dr_grpo", p * (1 - p))):
        norm = np.sum(curve[middle] * counts[middle]) / counts[middle].sum()
        ax.plot(p, curve / norm, styles[m], color="gray", lw=2, alpha=0.5,
                label=f"closed form Σ|A| ({'GRPO' if m == 'grpo' else 'Dr. GRPO'})")
    ax.set_xlabel(f"group pass rate p (G = {group})")
    ax.set_ylabel("per-group weight / its mean over 0.25 < p < 0.75")
    ax.set_title("per-group weight against p (mean over seeds)", fontsize=10)
    ax.legend(fontsize=6)
    ax = axes[1]
    names = [name for name, _ in BINS]
    series = [("prompt_share", "groups"), ("grpo/abs_adv", "GRPO Σ|A|"),
              ("dr_grpo/abs_adv", "Dr. GRPO Σ|A|"), ("grpo/grad_norm", "GRPO ‖ΣAg‖"),
              ("dr_grpo/grad_norm", "Dr. GRPO ‖ΣAg‖")]
    width = 0.16
    for index, (key, label) in enumerate(series):
        stats = [summary["bins"][name][key] for name in names]
        ax.bar(np.arange(len(names)) + (index - 2) * width, [s["mean"] * 100 for s in stats],
               width, yerr=[(s["ci95"][1] - s["ci95"][0]) / 2 * 100 for s in stats],
               capsize=2, label=label)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels([f"p in {n}" for n in names])
    ax.set_ylabel("share of the total weight (%)")
    ax.set_title("share by bin, 95% CI over seeds", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "weights.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.path.join(ROOT, "runs/experiments/off_policy/base"))
    parser.add_argument("--workdir",
                        default=os.path.join(ROOT, "runs/experiments/difficulty_bias"))
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--group", type=int, default=16, help="G")
    parser.add_argument("--reuse", action="store_true", help="analyse saved groups only")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    s = None
    per_seed = {}
    for seed in seeds:
        path = os.path.join(args.workdir, f"seed={seed}.npz")
        if not (args.reuse and os.path.isfile(path)):
            if s is None:
                s = setup(args.base)
            start = time.time()
            data = collect(s, seed, args.prompts, args.group, prompts_per_call=32)
            np.savez_compressed(path, **{k: np.asarray(v) for k, v in data.items()})
            print(f"seed {seed}: sampled and measured in {time.time() - start:.0f} s", flush=True)
        per_seed[seed] = seed_figures(dict(np.load(path)))
    summary = summarize(per_seed)
    summary["settings"] = {"prompts": args.prompts, "group": args.group, "reward": "accuracy",
                           "adv_eps": EPS}
    summary["per_seed"] = {str(k): v for k, v in per_seed.items()}
    text = table(summary)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, args.out, args.group)
    print(text)


if __name__ == "__main__":
    main()
