"""The baselines study: the variance of the policy-gradient estimator on the language model
under no baseline, GRPO's group mean, leave-one-out (RLOO) and the optimal baseline b*.

For each seed: 64 held-out problems (the test split, `task.examples("test", 64, seed=S)`),
a pool of N = 64 completions of each sampled by the base model at temperature 1 (key S),
scored with the main job's reward (accuracy + 0.2 x format; accuracy alone is analysed
too), and the per-sequence score functions g_i = grad log pi(y_i | x)
(`rl.update.sequence_score_grads`, 16 rows at a time) reduced to each prompt's Gram matrix
K_ij = <g_i, g_j> (every quantity below is a quadratic form in K). The pool is split at
random into 4 groups of G = 16 (32 partitions), and each estimator

    g_hat = 1/G sum_{i in group} (r_i - b_i) g_i

is formed for each group with b_i:

* none: 0;
* group mean (GRPO's, the sample itself included): mean of the group's rewards;
* leave-one-out (RLOO): mean of the group's other G - 1 rewards;
* b* leave-one-out: sum_{j != i} r_j ||g_j||^2 / sum_{j != i} ||g_j||^2 over the group;
* mean, constant: the mean reward of the prompt's other 48 samples (outside the group);
* b*, constant: b* = E[r ||g||^2] / E[||g||^2] over the prompt's other 48 samples
  (`losses.optimal_baseline`);
* b* in-group (self included, `losses.optimal_baseline` on the group): for the bias check.

Per prompt, tr Cov(g_hat) = E||g_hat||^2 - ||E g_hat||^2 with E||g_hat||^2 the average of
c^T K c over the groups and ||E g_hat||^2 = s^2 ||grad J||^2, s = 1 for the unbiased
estimators and (G - 1)/G for the group mean (exactly (G - 1)/G times RLOO), ||grad J||^2
estimated without bias by the U-statistic sum_{i != j} r_i r_j K_ij / (N (N - 1)) over the
pool. The bias check: <E g_hat, grad J> / ||grad J||^2, estimated from the inner product of
each group's g_hat with the mean of r_j g_j over the other 48 samples (unbiased because
E[g] = 0 and the samples are independent). The single-sample check: V(b) = E[(r - b)^2
||g||^2] - ||grad J||^2 for constants b estimated on one half of the pool and evaluated on
the other (cross-fitted), along b = mean + lambda (b* - mean).

    python experiments/baselines/measure.py              # sample, measure, analyse
    python experiments/baselines/measure.py --reuse      # analyse the saved pools again

Writes runs/experiments/baselines/seed=S.npz (rewards, lengths, Gram matrices), and next to
this file summary.json, table.md and variance.png. Intervals: 95% over seeds (Student's t,
`grpo_jax.sweep.interval`); differences between estimators paired by seed
(`sweep.paired_interval`).
"""

from __future__ import annotations

import argparse
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

import numpy as np

from grpo_jax import sweep

ESTIMATORS = ("none", "group_mean", "rloo", "bstar_loo", "mean_const", "bstar_const")
BIAS_ONLY = ("bstar_group",)
LABELS = {"none": "none (b = 0)", "group_mean": "group mean, self included (GRPO)",
          "rloo": "leave-one-out mean (RLOO)", "bstar_loo": "b* leave-one-out (in the group)",
          "mean_const": "mean reward, constant (other 48 samples)",
          "bstar_const": "b* constant (other 48 samples)",
          "bstar_group": "b* in the group, self included"}
REWARDS = {"main": {"accuracy": 1.0, "format": 0.2}, "accuracy": {"accuracy": 1.0}}
LAMBDAS = np.round(np.arange(-1.0, 3.01, 0.25), 2)


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


def grad_fn(s, rows: int):
    """jit(tokens, attention, loss_mask) -> [rows, P] flattened score functions."""
    import jax

    from grpo_jax.rl.update import flat_sequence_score_grads

    policy, params, prompt_len = s["policy"], s["params"], s["prompt_len"]
    return jax.jit(lambda tokens, attention, loss_mask: flat_sequence_score_grads(
        policy, params, tokens, attention, prompt_len, loss_mask=loss_mask))


def check_logp(s, ro, rows: int = 16) -> float:
    """max |sum_t teacher-forced log pi - sum_t sampler log pi| over the first rows: the
    score functions are of the distribution that sampled."""
    from grpo_jax.rl.update import sequence_logp

    full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)[:rows]
    attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)[:rows]
    logp, _ = sequence_logp(s["policy"], s["params"], full, attention, s["prompt_len"])
    mask = ro.loss_mask[:rows]
    return float(np.max(np.abs(np.where(mask, np.asarray(logp), 0).sum(1)
                               - np.where(mask, ro.behaviour_logp[:rows], 0).sum(1))))


def collect(s, seed: int, num_prompts: int, pool: int, prompts_per_call: int,
            grad_rows: int) -> dict:
    """Samples `pool` completions of each of `num_prompts` held-out problems and returns
    rewards [n, N] per component, lengths, truncation and the Gram matrices [n, N, N]."""
    import jax

    from grpo_jax import tasks as tasks_lib
    from grpo_jax.rl.rollout import rollout
    from grpo_jax.sampling import SamplingConfig

    config, task, tokenizer = s["config"], s["task"], s["tokenizer"]
    examples = task.examples("test", num_prompts, seed=seed)
    sampling = SamplingConfig(max_new_tokens=int(config.rl.max_new_tokens), temperature=1.0,
                              eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id,
                              prompt_group=pool)
    fn = s.setdefault("grad_fn", grad_fn(s, grad_rows))  # compiled once for every seed
    key = jax.random.key(seed)
    out = {"accuracy": [], "format": [], "lengths": [], "truncated": [], "gram": [],
           "ids": [ex.id for ex in examples], "texts": []}
    logp_gap = 0.0
    for start in range(0, num_prompts, prompts_per_call):
        chunk = examples[start:start + prompts_per_call]
        rows = [ex for ex in chunk for _ in range(pool)]
        prompts = [tasks_lib.apply_template(ex, template=config.task.template,
                                            tokenizer=tokenizer) for ex in rows]
        key, sub = jax.random.split(key)
        ro = rollout(s["policy"], s["params"], tokenizer, rows, prompts, sub,
                     sampling=sampling, prompt_len=s["prompt_len"],
                     reward_fns=task.reward_fns(), weights={"accuracy": 1.0, "format": 1.0})
        if start == 0:
            logp_gap = check_logp(s, ro)
        full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
        attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)
        for p in range(len(chunk)):
            block = slice(p * pool, (p + 1) * pool)
            grads = np.concatenate([np.asarray(fn(full[block][i:i + grad_rows],
                                                  attention[block][i:i + grad_rows],
                                                  ro.loss_mask[block][i:i + grad_rows]))
                                    for i in range(0, pool, grad_rows)])
            out["gram"].append((grads @ grads.T).astype(np.float64))
        n = len(chunk)
        out["accuracy"].append(ro.components["accuracy"].reshape(n, pool))
        out["format"].append(ro.components["format"].reshape(n, pool))
        out["lengths"].append(ro.lengths.reshape(n, pool))
        out["truncated"].append(ro.truncated.reshape(n, pool))
        out["texts"] += ro.texts
        print(f"  seed {seed}: {start + n}/{num_prompts} prompts", flush=True)
    data = {k: np.concatenate(v) if k in ("accuracy", "format", "lengths", "truncated")
            else v for k, v in out.items()}
    data["gram"] = np.stack(out["gram"])
    data["logp_gap"] = logp_gap
    return data


def rewards_of(data: dict, kind: str) -> np.ndarray:
    return sum(w * np.asarray(data[name], np.float64) for name, w in REWARDS[kind].items())


# ------------------------------------------------------------------------------ analysis
def prompt_stats(r: np.ndarray, K: np.ndarray, G: int, partitions: int,
                 rng: np.random.Generator) -> dict:
    """One prompt's figures from its pool rewards r [N] and Gram matrix K [N, N]."""
    import jax
    import jax.numpy as jnp

    from grpo_jax import losses

    N = len(r)
    M = N // G
    D = np.diag(K)
    off = K - np.diag(D)
    grad_j_sq = float(r @ off @ r) / (N * (N - 1))  # U-statistic of ||grad J||^2
    mean_score_sq = float(off.sum()) / (N * (N - 1))  # U-statistic of ||E g||^2
    # groups: [R * M, G] indices, and each group's complement [R * M, N - G]
    perms = np.stack([rng.permutation(N) for _ in range(partitions)])
    idx = perms.reshape(partitions * M, G)
    comp = np.stack([np.setdiff1d(np.arange(N), row) for row in idx])
    rg, Dg = r[idx], D[idx]
    flat = jnp.asarray(rg.reshape(-1), jnp.float32)
    centred = np.asarray(losses.group_advantages(flat, group_size=G, scale="none"),
                         np.float64).reshape(rg.shape)
    rloo = np.asarray(losses.rloo_advantages(flat, group_size=G), np.float64).reshape(rg.shape)
    optimal = jax.vmap(losses.optimal_baseline)
    b_group = np.asarray(optimal(jnp.asarray(rg, jnp.float32), jnp.asarray(Dg, jnp.float32)),
                         np.float64)
    b_const = np.asarray(optimal(jnp.asarray(r[comp], jnp.float32),
                                 jnp.asarray(D[comp], jnp.float32)), np.float64)
    # b* leave-one-out (not in the library): sum_{j != i} r_j D_j / sum_{j != i} D_j
    num = (rg * Dg).sum(1, keepdims=True) - rg * Dg
    den = Dg.sum(1, keepdims=True) - Dg
    others_mean = (rg.sum(1, keepdims=True) - rg) / (G - 1)
    b_loo = np.where(den > 0, num / np.where(den > 0, den, 1.0), others_mean)
    coef = {"none": rg, "group_mean": centred, "rloo": rloo, "bstar_loo": rg - b_loo,
            "mean_const": rg - r[comp].mean(1, keepdims=True),
            "bstar_const": rg - b_const[:, None], "bstar_group": rg - b_group[:, None]}
    Kg = K[idx[:, :, None], idx[:, None, :]]  # [R M, G, G]
    h = (K[idx[:, :, None], comp[:, None, :]] @ r[comp][:, :, None])[..., 0] / (N - G)
    out = {"grad_j_sq": grad_j_sq, "mean_score_sq": mean_score_sq, "score_sq": float(D.mean()),
           "second": {}, "cross": {}, "var": {}}
    scale = {"group_mean": (G - 1) / G}
    for name, c in coef.items():
        c = c / G
        second = float(np.mean(np.einsum("ki,kij,kj->k", c, Kg, c)))
        out["second"][name] = second
        out["cross"][name] = float(np.mean(np.sum(c * h, 1)))
        if name in ESTIMATORS:
            out["var"][name] = second - scale.get(name, 1.0) ** 2 * grad_j_sq
    # the single-sample term with constants fitted on one half, evaluated on the other
    curve = np.zeros(len(LAMBDAS))
    fits = {"zero": 0.0, "mean": 0.0, "bstar": 0.0, "bstar_in_sample": 0.0}
    splits = 8
    for _ in range(splits):
        half = rng.permutation(N)
        for a, b in ((half[: N // 2], half[N // 2:]), (half[N // 2:], half[: N // 2])):
            mean_a = r[a].mean()
            bstar_a = (r[a] @ D[a]) / D[a].sum() if D[a].sum() > 0 else mean_a
            v = lambda base: float(np.mean((r[b] - base) ** 2 * D[b])) - grad_j_sq  # noqa
            fits["zero"] += v(0.0)
            fits["mean"] += v(mean_a)
            fits["bstar"] += v(bstar_a)
            curve += np.array([v(mean_a + lam * (bstar_a - mean_a)) for lam in LAMBDAS])
    fits = {k: v / (2 * splits) for k, v in fits.items()}
    bstar = (r @ D) / D.sum() if D.sum() > 0 else r.mean()
    fits["bstar_in_sample"] = float(np.mean((r - bstar) ** 2 * D)) - grad_j_sq
    out["single"] = fits
    out["curve"] = (curve / (2 * splits)).tolist()
    out["bstar"], out["mean_reward"] = float(bstar), float(r.mean())
    out["reward_var"] = float(r.var())
    return out


def seed_figures(data: dict, kind: str, G: int, partitions: int, seed: int) -> dict:
    """The per-seed aggregates of one reward definition over the seed's prompts."""
    rewards = rewards_of(data, kind)
    rng = np.random.default_rng(seed)
    stats = [prompt_stats(rewards[p], data["gram"][p], G, partitions, rng)
             for p in range(len(rewards))]
    total = lambda f: float(sum(f(s) for s in stats))  # noqa: E731
    none = total(lambda s: s["var"]["none"])
    fig = {"prompts": len(stats),
           "informative_prompts": int(sum(s["reward_var"] > 0 for s in stats))}
    fig["var_ratio"] = {e: total(lambda s, e=e: s["var"][e]) / none for e in ESTIMATORS}
    ratios = {e: [s["var"][e] / s["var"]["none"] for s in stats
                  if s["reward_var"] > 0 and s["var"]["none"] > 0] for e in ESTIMATORS}
    fig["var_ratio_mean_over_prompts"] = {e: float(np.mean(v)) for e, v in ratios.items()}
    grad_j = total(lambda s: s["grad_j_sq"])
    fig["grad_j_sq_over_var_none"] = grad_j / none
    fig["bias_scale"] = {e: total(lambda s, e=e: s["cross"][e]) / grad_j
                         for e in ESTIMATORS + BIAS_ONLY}
    fig["mean_score_sq_rel"] = total(lambda s: s["mean_score_sq"]) / total(
        lambda s: s["score_sq"])
    v0 = total(lambda s: s["single"]["zero"])
    fig["single_ratio"] = {k: total(lambda s, k=k: s["single"][k]) / v0
                           for k in ("mean", "bstar", "bstar_in_sample")}
    fig["curve"] = (np.sum([s["curve"] for s in stats], 0) / v0).tolist()
    informative = [s for s in stats if s["reward_var"] > 0]
    fig["bstar_minus_mean"] = float(np.mean([s["bstar"] - s["mean_reward"]
                                             for s in informative]))
    fig["abs_bstar_minus_mean"] = float(np.mean([abs(s["bstar"] - s["mean_reward"])
                                                 for s in informative]))
    fig["per_prompt"] = [{"mean_reward": s["mean_reward"], "bstar": s["bstar"]} for s in stats]
    return fig


def mechanism(data: dict) -> dict:
    """Why b* differs from the mean: ||g||^2 of correct and wrong completions, and its
    correlation with length."""
    D = np.stack([np.diag(k) for k in data["gram"]])
    acc = np.asarray(data["accuracy"], bool)
    lengths = np.asarray(data["lengths"], np.float64)
    return {"score_sq_correct": float(D[acc].mean()), "score_sq_wrong": float(D[~acc].mean()),
            "corr_length_score_sq": float(np.corrcoef(lengths.ravel(), D.ravel())[0, 1]),
            "pass@1": float(acc.mean()), "format": float(np.mean(data["format"])),
            "mean_length": float(lengths.mean()), "logp_gap": float(data["logp_gap"])}


def summarize(per_seed: dict) -> dict:
    seeds = sorted(per_seed)
    summary = {"seeds": seeds, "rewards": {}}
    for kind in REWARDS:
        figs = [per_seed[s][kind] for s in seeds]
        entry = {"var_ratio": {}, "var_ratio_mean_over_prompts": {}, "bias_scale": {},
                 "paired": {}, "single_ratio": {}}
        for e in ESTIMATORS:
            entry["var_ratio"][e] = sweep.interval([f["var_ratio"][e] for f in figs])
            entry["var_ratio_mean_over_prompts"][e] = sweep.interval(
                [f["var_ratio_mean_over_prompts"][e] for f in figs])
        for e in ESTIMATORS + BIAS_ONLY:
            entry["bias_scale"][e] = sweep.interval([f["bias_scale"][e] for f in figs])
        for a, b in (("rloo", "group_mean"), ("rloo", "mean_const"),
                     ("bstar_const", "mean_const"), ("bstar_loo", "rloo"),
                     ("bstar_const", "rloo")):
            entry["paired"][f"{a} - {b}"] = sweep.paired_interval(
                [f["var_ratio"][a] for f in figs], [f["var_ratio"][b] for f in figs])
        for k in ("mean", "bstar", "bstar_in_sample"):
            entry["single_ratio"][k] = sweep.interval([f["single_ratio"][k] for f in figs])
        entry["single_bstar_minus_mean"] = sweep.paired_interval(
            [f["single_ratio"]["bstar"] for f in figs], [f["single_ratio"]["mean"] for f in figs])
        for k in ("mean_score_sq_rel", "grad_j_sq_over_var_none", "bstar_minus_mean",
                  "abs_bstar_minus_mean", "informative_prompts"):
            entry[k] = sweep.interval([f[k] for f in figs])
        curve = np.asarray([f["curve"] for f in figs])
        entry["curve"] = {"lambda": LAMBDAS.tolist(), "mean": curve.mean(0).tolist(),
                          "per_seed": curve.tolist(),
                          "argmin_lambda": sweep.interval(
                              [float(LAMBDAS[int(np.argmin(c))]) for c in curve])}
        summary["rewards"][kind] = entry
    summary["mechanism"] = {k: sweep.interval([per_seed[s]["mechanism"][k] for s in seeds])
                            for k in per_seed[seeds[0]]["mechanism"]}
    return summary


def fmt(stats: dict, digits: int = 3, signed: bool = False) -> str:
    return sweep.format_interval(stats, 1.0, digits, signed)


def table(summary: dict, G: int) -> str:
    main, acc = summary["rewards"]["main"], summary["rewards"]["accuracy"]
    lines = [f"Variance of the G = {G}-sample estimator, tr Cov relative to no baseline "
             "(mean ± 95% interval over seeds):", "",
             "| baseline | unbiased? | acc + 0.2 fmt: total over prompts | acc + 0.2 fmt: "
             "mean of per-prompt ratios | accuracy only: total over prompts | "
             "<E g_hat, grad J> / ‖grad J‖² (acc + 0.2 fmt) |",
             "|---|---|---|---|---|---|"]
    unbiased = {"group_mean": f"no: x (G-1)/G = {(G - 1) / G:.4f}"}
    for e in ESTIMATORS:
        lines.append(f"| {LABELS[e]} | {unbiased.get(e, 'yes')} | {fmt(main['var_ratio'][e])} | "
                     f"{fmt(main['var_ratio_mean_over_prompts'][e])} | "
                     f"{fmt(acc['var_ratio'][e])} | {fmt(main['bias_scale'][e], 2)} |")
    for e in BIAS_ONLY:
        lines.append(f"| {LABELS[e]} | no (b depends on y_i) | - | - | - | "
                     f"{fmt(main['bias_scale'][e], 2)} |")
    lines += ["", "Paired differences of the variance ratio (same seed; negative: the first "
              "is lower):", "", "| difference | acc + 0.2 fmt | accuracy only |", "|---|---|---|"]
    for name in main["paired"]:
        lines.append(f"| {name} | {fmt(main['paired'][name], 4, True)} | "
                     f"{fmt(acc['paired'][name], 4, True)} |")
    lines += ["", "Single-sample term (r - b) g, constants fitted on half the pool and "
              "evaluated on the other half, tr Cov relative to b = 0:", "",
              "| b | acc + 0.2 fmt | accuracy only |", "|---|---|---|"]
    for k, label in (("mean", "mean reward"), ("bstar", "b* (cross-fitted)"),
                     ("bstar_in_sample", "b* (in-sample: its own minimum)")):
        lines.append(f"| {label} | {fmt(main['single_ratio'][k])} | "
                     f"{fmt(acc['single_ratio'][k])} |")
    lines.append(f"| b* minus mean reward (paired) | "
                 f"{fmt(main['single_bstar_minus_mean'], 4, True)} | "
                 f"{fmt(acc['single_bstar_minus_mean'], 4, True)} |")
    lines.append(f"| argmin over lambda of b = mean + lambda (b* - mean) | "
                 f"{fmt(main['curve']['argmin_lambda'], 2)} | "
                 f"{fmt(acc['curve']['argmin_lambda'], 2)} |")
    m = summary["mechanism"]
    lines += ["", "Checks and the mechanism:", "", "| quantity | acc + 0.2 fmt | accuracy only |",
              "|---|---|---|",
              f"| ‖E g‖² / E‖g‖² (U-statistic; 0 if E[g] = 0) | "
              f"{fmt(main['mean_score_sq_rel'], 4, True)} | - |",
              f"| ‖grad J‖² / tr Cov(none, G = {G}) | {fmt(main['grad_j_sq_over_var_none'], 4)} "
              f"| {fmt(acc['grad_j_sq_over_var_none'], 4)} |",
              f"| b* - mean reward, mean over prompts with reward variance | "
              f"{fmt(main['bstar_minus_mean'], 3, True)} | "
              f"{fmt(acc['bstar_minus_mean'], 3, True)} |",
              f"| abs(b* - mean reward) | {fmt(main['abs_bstar_minus_mean'])} | "
              f"{fmt(acc['abs_bstar_minus_mean'])} |",
              f"| prompts (of 64) with reward variance | {fmt(main['informative_prompts'], 1)} | "
              f"{fmt(acc['informative_prompts'], 1)} |",
              f"| E‖g‖², correct / wrong completions | {fmt(m['score_sq_correct'], 0)} / "
              f"{fmt(m['score_sq_wrong'], 0)} | |",
              f"| corr(length, ‖g‖²) | {fmt(m['corr_length_score_sq'], 2)} | |",
              f"| pass@1 / format rate / mean length of the samples | {fmt(m['pass@1'])} / "
              f"{fmt(m['format'])} / {fmt(m['mean_length'], 1)} | |",
              f"| max abs(teacher-forced - sampler log pi(y)) | {fmt(m['logp_gap'], 6)} | |"]
    return "\n".join(lines) + "\n"


def plot(summary: dict, per_seed: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    width = 0.38
    for k, (kind, label) in enumerate((("main", "acc + 0.2 fmt"), ("accuracy", "accuracy"))):
        entry = summary["rewards"][kind]["var_ratio"]
        means = [entry[e]["mean"] for e in ESTIMATORS]
        halves = [(entry[e]["ci95"][1] - entry[e]["ci95"][0]) / 2 for e in ESTIMATORS]
        ax.bar(np.arange(len(ESTIMATORS)) + (k - 0.5) * width, means, width, yerr=halves,
               capsize=3, label=label)
    ax.set_xticks(np.arange(len(ESTIMATORS)))
    ax.set_xticklabels(["none", "group\nmean", "RLOO", "b* LOO", "mean\nconst", "b*\nconst"],
                       fontsize=8)
    ax.set_ylabel("tr Cov / tr Cov(none)")
    ax.set_title("G-sample estimator variance, 95% CI over seeds", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    for kind, label in (("main", "acc + 0.2 fmt"), ("accuracy", "accuracy")):
        curve = summary["rewards"][kind]["curve"]
        per = np.asarray(curve["per_seed"])
        ax.plot(curve["lambda"], per.mean(0), marker="o", ms=3, label=label)
        ax.fill_between(curve["lambda"], per.min(0), per.max(0), alpha=0.2)
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    ax.axvline(1, color="gray", lw=0.8)
    ax.set_xlabel("λ in b = mean + λ (b* − mean)  (0: mean, 1: b*)")
    ax.set_ylabel("single-sample tr Cov / (b = 0)")
    ax.set_title("constant baselines, cross-fitted (band: seeds)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[2]
    for seed in sorted(per_seed):
        points = per_seed[seed]["main"]["per_prompt"]
        ax.scatter([p["mean_reward"] for p in points], [p["bstar"] for p in points], s=10,
                   label=f"seed {seed}")
    ax.plot([0, 1.2], [0, 1.2], color="gray", lw=0.8)
    ax.set_xlabel("mean reward of the prompt (pool of 64)")
    ax.set_ylabel("b* = E[r‖g‖²] / E[‖g‖²]")
    ax.set_title("b* against the mean, per prompt (acc + 0.2 fmt)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "variance.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.path.join(ROOT, "runs/experiments/off_policy/base"))
    parser.add_argument("--workdir", default=os.path.join(ROOT, "runs/experiments/baselines"))
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--pool", type=int, default=64, help="completions per prompt (N)")
    parser.add_argument("--group", type=int, default=16, help="G")
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--reuse", action="store_true", help="analyse saved pools only")
    args = parser.parse_args()
    if args.pool % args.group:
        raise SystemExit("--pool must be a multiple of --group")
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
            data = collect(s, seed, args.prompts, args.pool, prompts_per_call=16, grad_rows=16)
            np.savez_compressed(path, **{k: np.asarray(v) for k, v in data.items()})
            print(f"seed {seed}: sampled and measured in {time.time() - start:.0f} s", flush=True)
        data = dict(np.load(path))
        start = time.time()
        per_seed[seed] = {kind: seed_figures(data, kind, args.group, args.partitions, seed)
                          for kind in REWARDS}
        per_seed[seed]["mechanism"] = mechanism(data)
        print(f"seed {seed}: analysed in {time.time() - start:.0f} s", flush=True)
    summary = summarize(per_seed)
    summary["settings"] = {k: getattr(args, k) for k in ("prompts", "pool", "group",
                                                         "partitions")}
    summary["settings"]["rewards"] = REWARDS
    summary["per_seed"] = {str(k): {kind: {n: v for n, v in f.items() if n != "per_prompt"}
                                    if kind in REWARDS else f for kind, f in per.items()}
                           for k, per in per_seed.items()}
    text = table(summary, args.group)
    sweep.write_analysis(args.out, summary, text)
    plot(summary, per_seed, args.out)
    print(text)


if __name__ == "__main__":
    main()
