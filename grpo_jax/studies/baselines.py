"""Baselines on the language model: the variance of the score-function estimator under no
baseline, GRPO's group mean, leave-one-out (RLOO) and the optimal constant b*.

A measurement on pretrained bases (the main job's pretraining, shared with the other
studies), no training. Per (base, seed) the run `base_eval` evaluates the base on the
held-out problems (an eval stage only: the base's pass@1, and the directory the
measurement is written into); `measure` then samples, from the base, a pool of N
completions of each of P held-out problems (the first P of the main job's evaluation
problems, `task.eval_seed`: fixed across seeds; the sampling key is the seed's), scores
them (the main job's accuracy + 0.2 x format, and accuracy alone) and reduces the
per-sequence score functions g_i = grad log pi(y_i | x) (`rl.update.sequence_score_grads`)
to each problem's Gram matrix K_ij = <g_i, g_j>: `pool.npz` in the run's directory
(resumable: a run with one is not measured again). Every figure is a quadratic form in K.

The analysis' arms are the estimators g_hat = 1/G sum_i (r_i - b_i) g_i on groups of G drawn
from the pool (random partitions), with b_i:

* none: 0;
* group_mean (GRPO's, the sample itself included): the group's mean reward;
* rloo: the mean of the group's other G - 1 rewards;
* bstar_loo: sum_{j != i} r_j ||g_j||^2 / sum_{j != i} ||g_j||^2 over the group;
* mean_const: the mean reward of the problem's other N - G samples (outside the group);
* bstar_const: b* = E[r ||g||^2] / E[||g||^2] over those other samples
  (`losses.optimal_baseline`);
* bstar_group (the bias check only): `losses.optimal_baseline` on the group itself.

Per problem tr Cov(g_hat) = E||g_hat||^2 - s^2 ||grad J||^2 (s = 1 for the unbiased
estimators, (G - 1)/G for the group mean, which is exactly (G - 1)/G times RLOO), with
||grad J||^2 the U-statistic sum_{i != j} r_i r_j K_ij / (N (N - 1)); `var_ratio` is the
sum over problems relative to no baseline. `bias_scale` is <E g_hat, grad J> / ||grad J||^2,
estimated from each group's g_hat against the mean of r_j g_j over the samples outside the
group (unbiased: E[g] = 0, independent samples). The single-sample check fits constants on
half of each pool and evaluates (r - b)^2 ||g||^2 on the other half (cross-fitted), along
b = mean + lambda (b* - mean).

The pool (`measure.measure_pools`) is measured as difficulty_bias measures its groups.
"""

from __future__ import annotations

import math

import numpy as np

from grpo_jax import sweep
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import measure as measure_lib

RUN_ARM = "base_eval"
POOL_FILE = "pool.npz"
ESTIMATORS = ("none", "group_mean", "rloo", "bstar_loo", "mean_const", "bstar_const")
BIAS_ONLY = ("bstar_group",)
LABELS = {"none": "none (b = 0)", "group_mean": "group mean, self included (GRPO)",
          "rloo": "leave-one-out mean (RLOO)", "bstar_loo": "b* leave-one-out (in the group)",
          "mean_const": "mean reward, constant (the problem's other samples)",
          "bstar_const": "b* constant (the problem's other samples)",
          "bstar_group": "b* in the group, self included"}
REWARDS = {"main": {"accuracy": 1.0, "format": 0.2}, "accuracy": {"accuracy": 1.0}}
LAMBDAS = np.round(np.arange(-1.0, 3.01, 0.25), 2)
EVAL = measure_lib.BASE_EVAL  # RUN_ARM's figures: the base's held-out evaluation
# Per tier: problems, pool N, group G, random partitions of the pool, problems per sampling
# call and rows per score-function call.
SIZES = {"full": {"prompts": 64, "pool": 64, "group": 16, "partitions": 32,
                  "prompts_per_call": 16, "grad_rows": 16},
         "mini": {"prompts": 4, "pool": 16, "group": 4, "partitions": 4,
                  "prompts_per_call": 4, "grad_rows": 16}}


# ---- configs ---------------------------------------------------------------------------------

def base_config(tier: str):
    """The main job's pretraining (1500 steps; the smoke preset's 3 at the mini tier): the
    base off_policy, kl_beta and cold_start start from, shared by its config."""
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def eval_config(tier: str = "full"):
    """The run of every (base, seed): the base's held-out evaluation (the main job's
    eval_base: 128 problems x 8 samples at temperature 1; the smoke sizes at the mini tier),
    from the base's parameters (model.init_from, set per base). No training."""
    config = common.main_job(common.preset(tier))
    config.stages = "eval_base"
    del config.pretrain, config.eval_final
    config.model.init_from = ""  # the base's workdir, set by the study per base
    return config


def arm_configs(tier: str) -> dict:
    return {RUN_ARM: eval_config(tier)}


# ---- the per-seed figures ----------------------------------------------------------------------

def prompt_stats(r: np.ndarray, K: np.ndarray, G: int, partitions: int,
                 rng: np.random.Generator) -> dict:
    """One problem's figures from its pool rewards r [N] and Gram matrix K [N, N]."""
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
           "cross": {}, "var": {}}
    scale = {"group_mean": (G - 1) / G}
    for name, c in coef.items():
        c = c / G
        second = float(np.mean(np.einsum("ki,kij,kj->k", c, Kg, c)))
        out["cross"][name] = float(np.mean(np.sum(c * h, 1)))
        if name in ESTIMATORS:
            out["var"][name] = second - scale.get(name, 1.0) ** 2 * grad_j_sq
    # the single-sample term with constants fitted on one half, evaluated on the other
    curve = np.zeros(len(LAMBDAS))
    fits = {"zero": 0.0, "mean": 0.0, "bstar": 0.0}
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
    out["curve"] = curve / (2 * splits)
    out["bstar"], out["mean_reward"] = float(bstar), float(r.mean())
    out["reward_var"] = float(r.var())
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(b) else math.nan


def seed_figures(rewards: np.ndarray, gram: np.ndarray, G: int, partitions: int,
                 seed: int) -> dict:
    """One (base, seed)'s aggregates of one reward definition over its problems."""
    rng = np.random.default_rng(seed)
    stats = [prompt_stats(rewards[p], gram[p], G, partitions, rng) for p in range(len(rewards))]

    def total(f):
        return float(sum(f(s) for s in stats))

    none = total(lambda s: s["var"]["none"])
    informative = [s for s in stats if s["reward_var"] > 0]
    fig = {"informative_prompts": len(informative)}
    fig["var_ratio"] = {e: _ratio(total(lambda s, e=e: s["var"][e]), none) for e in ESTIMATORS}
    ratios = {e: [s["var"][e] / s["var"]["none"] for s in informative if s["var"]["none"] > 0]
              for e in ESTIMATORS}
    fig["var_ratio_per_prompt"] = {e: float(np.mean(v)) if v else math.nan
                                   for e, v in ratios.items()}
    grad_j = total(lambda s: s["grad_j_sq"])
    fig["grad_j_sq_over_var_none"] = _ratio(grad_j, none)
    fig["bias_scale"] = {e: _ratio(total(lambda s, e=e: s["cross"][e]), grad_j)
                         for e in ESTIMATORS + BIAS_ONLY}
    fig["mean_score_sq_rel"] = _ratio(total(lambda s: s["mean_score_sq"]),
                                      total(lambda s: s["score_sq"]))
    v0 = total(lambda s: s["single"]["zero"])
    fig["single_ratio"] = {k: _ratio(total(lambda s, k=k: s["single"][k]), v0)
                           for k in ("mean", "bstar", "bstar_in_sample")}
    curve = np.sum([s["curve"] for s in stats], 0) / v0 if v0 else np.full(len(LAMBDAS),
                                                                           np.nan)
    fig["curve"] = curve.tolist()
    fig["argmin_lambda"] = (float(LAMBDAS[int(np.nanargmin(curve))])
                            if np.isfinite(curve).any() else math.nan)
    fig["bstar"] = float(np.mean([s["bstar"] for s in informative])) if informative else math.nan
    fig["mean_reward"] = (float(np.mean([s["mean_reward"] for s in informative]))
                          if informative else math.nan)
    fig["per_prompt"] = [(s["mean_reward"], s["bstar"]) for s in informative]
    return fig


def mechanism(data: dict, accuracy: np.ndarray) -> dict:
    """Why b* differs from the mean: ||g||^2 of correct and wrong completions, its
    correlation with length, and the samples' pass@1, format rate and length."""
    D = np.stack([np.diag(k) for k in data["gram"]])
    acc = np.asarray(accuracy, bool)
    lengths = np.asarray(data["lengths"], np.float64)
    corr = (float(np.corrcoef(lengths.ravel(), D.ravel())[0, 1])
            if lengths.std() > 0 and D.std() > 0 else math.nan)
    return {"score_sq_correct": float(D[acc].mean()) if acc.any() else math.nan,
            "score_sq_wrong": float(D[~acc].mean()) if (~acc).any() else math.nan,
            "corr_length_score_sq": corr, "sample_pass@1": float(acc.mean()),
            "sample_format": float(np.mean(data["format"])), "sample_length": float(
                lengths.mean()), "logp_gap": float(data["logp_gap"])}


# ---- the analysis -------------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    sizes = SIZES[runs.tier]
    G, partitions = sizes["group"], sizes["partitions"]
    records, pools = measure_lib.load_pools(runs.arm(RUN_ARM), POOL_FILE)
    figs = []
    for record, data in zip(records, pools):
        seed_figs = {kind: seed_figures(measure_lib.task_rewards(data, weights, runs.tier),
                                        data["gram"], G, partitions, record.seed)
                     for kind, weights in REWARDS.items()}
        seed_figs["mechanism"] = mechanism(data, measure_lib.task_rewards(
            data, REWARDS["accuracy"], runs.tier))
        seed_figs["eval"] = measure_lib.base_eval_values(record)
        figs.append(seed_figs)
    arms = _arms(records, figs)
    specs = [spec for spec in dict.fromkeys(c.test for c in CLAIMS if c.test is not None)]
    note = (f"the measurement: the first {sizes['prompts']} held-out problems (task.eval_seed) "
            f"x a pool of {sizes['pool']} samples at temperature 1 (key: the seed), groups of "
            f"G = {G} from {partitions} random partitions of the pool; the arm {RUN_ARM}: "
            "the base's own held-out evaluation (eval stage, task.eval_size problems)")
    protocol = measure_lib.pool_protocol(pools, records, sizes["pool"], note, tier=runs.tier)
    extra = {"settings": {**sizes, "rewards": REWARDS, "lambdas": LAMBDAS.tolist()},
             "per_seed": [{"base": r.base, "seed": r.seed,
                           **{kind: {k: v for k, v in f[kind].items() if k != "per_prompt"}
                              for kind in REWARDS}, "mechanism": f["mechanism"]}
                          for r, f in zip(records, figs)]}
    return common.Analysis(arms=arms, specs=specs, table=table(arms, figs, G),
                           extra=extra, protocol=protocol,
                           plots=lambda out: plot(arms, figs, out))


def _arms(records: list, figs: list) -> dict:
    """The estimators as arms, one value per (base, seed) for each metric."""
    def arm(metrics: dict) -> dict:
        return common.measured_arm(records, metrics)

    arms = {}
    for e in ESTIMATORS:
        metrics = {"var_ratio": [f["main"]["var_ratio"][e] for f in figs],
                   "var_ratio_acc": [f["accuracy"]["var_ratio"][e] for f in figs],
                   "var_ratio_per_prompt": [f["main"]["var_ratio_per_prompt"][e] for f in figs],
                   "bias_scale": [f["main"]["bias_scale"][e] for f in figs]}
        if e == "none":
            metrics.update(single_ratio=[1.0] * len(figs), single_ratio_acc=[1.0] * len(figs),
                           baseline=[0.0] * len(figs), baseline_acc=[0.0] * len(figs))
        if e in ("mean_const", "bstar_const"):
            key, value = ("mean", "mean_reward") if e == "mean_const" else ("bstar", "bstar")
            metrics.update(single_ratio=[f["main"]["single_ratio"][key] for f in figs],
                           single_ratio_acc=[f["accuracy"]["single_ratio"][key] for f in figs],
                           baseline=[f["main"][value] for f in figs],
                           baseline_acc=[f["accuracy"][value] for f in figs])
        arms[e] = arm(metrics)
    arms["bstar_group"] = arm({"bias_scale": [f["main"]["bias_scale"]["bstar_group"]
                                              for f in figs]})
    arms[RUN_ARM] = arm({name: [f["eval"].get(name) for f in figs] for name in EVAL})
    return arms


def _cell(values, digits: int = 3, signed: bool = False, scale: float = 1.0) -> str:
    return sweep.format_interval(interval(values), scale, digits, signed)


def _diff(a, b, digits: int = 3) -> str:
    return sweep.format_interval(paired_interval(a, b), 1.0, digits, True)


def table(arms: dict, figs: list, G: int) -> str:
    if not figs:
        return "No pool measured yet.\n"
    m = {e: arms[e]["metrics"] for e in arms}
    n = len(figs)
    lines = [(f"Variance of the G = {G}-sample estimator, tr Cov relative to no baseline, and "
              f"its bias (mean ± 95% t half-width over the {n} (base, seed) values):"), "",
             ("| baseline | unbiased? | acc + 0.2 fmt: total over problems | acc + 0.2 fmt: mean "
              "of per-problem ratios | accuracy only: total over problems | ⟨E ĝ, ∇J⟩ / ‖∇J‖² "
              "(acc + 0.2 fmt) |"), "|---|---|---|---|---|---|"]
    unbiased = {"group_mean": f"no: x (G-1)/G = {(G - 1) / G:.4f}"}
    for e in ESTIMATORS:
        lines.append(f"| {LABELS[e]} | {unbiased.get(e, 'yes')} | {_cell(m[e]['var_ratio'])} | "
                     f"{_cell(m[e]['var_ratio_per_prompt'])} | {_cell(m[e]['var_ratio_acc'])} "
                     f"| {_cell(m[e]['bias_scale'], 2)} |")
    lines.append(f"| {LABELS['bstar_group']} | no (b depends on y_i) | - | - | - | "
                 f"{_cell(m['bstar_group']['bias_scale'], 2)} |")
    lines += ["", ("The constant baselines, fitted on half of each pool and evaluated on the "
                   "other half (single-sample term, tr Cov relative to b = 0), and b* against "
                   "the mean reward (mean over the problems whose rewards vary):"), "",
              "| quantity | acc + 0.2 fmt | accuracy only |", "|---|---|---|"]
    for e in ("mean_const", "bstar_const"):
        lines.append(f"| single-sample variance, {LABELS[e]} | {_cell(m[e]['single_ratio'])} | "
                     f"{_cell(m[e]['single_ratio_acc'])} |")
    lines.append("| b* minus mean reward (paired) | "
                 f"{_diff(m['bstar_const']['baseline'], m['mean_const']['baseline'])} | "
                 f"{_diff(m['bstar_const']['baseline_acc'], m['mean_const']['baseline_acc'])} |")
    lines.append("| argmin over λ of b = mean + λ (b* − mean), per (base, seed) | "
                 + ", ".join(f"{f['main']['argmin_lambda']:g}" for f in figs) + " | "
                 + ", ".join(f"{f['accuracy']['argmin_lambda']:g}" for f in figs) + " |")
    mech = {k: [f["mechanism"][k] for f in figs] for k in figs[0]["mechanism"]}
    main = {k: [f["main"][k] for f in figs] for k in ("mean_score_sq_rel",
                                                       "grad_j_sq_over_var_none",
                                                       "informative_prompts")}
    acc = {k: [f["accuracy"][k] for f in figs] for k in ("grad_j_sq_over_var_none",
                                                          "informative_prompts")}
    ev = m[RUN_ARM]
    lines += ["", "Checks and the mechanism:", "", "| quantity | value |", "|---|---|",
              (f"| ‖E g‖² / E‖g‖² (U-statistic; 0 if E[g] = 0) | "
               f"{_cell(main['mean_score_sq_rel'], 4, True)} |"),
              (f"| ‖∇J‖² / tr Cov(none, G = {G}): acc + 0.2 fmt / accuracy | "
               f"{_cell(main['grad_j_sq_over_var_none'], 2)} / "
               f"{_cell(acc['grad_j_sq_over_var_none'], 2)} |"),
              (f"| problems whose rewards vary: acc + 0.2 fmt / accuracy | "
               f"{_cell(main['informative_prompts'], 1)} / "
               f"{_cell(acc['informative_prompts'], 1)} |"),
              (f"| E‖g‖², correct / wrong completions | {_cell(mech['score_sq_correct'], 0)} / "
               f"{_cell(mech['score_sq_wrong'], 0)} |"),
              f"| corr(length, ‖g‖²) | {_cell(mech['corr_length_score_sq'], 2)} |",
              (f"| the pools: pass@1 / format rate / length | {_cell(mech['sample_pass@1'])} / "
               f"{_cell(mech['sample_format'])} / {_cell(mech['sample_length'], 1)} |"),
              (f"| the base's held-out evaluation ({RUN_ARM}): pass@1 / pass@8 / format rate | "
               f"{_cell(ev['pass@1'])} / {_cell(ev['pass@8'])} / {_cell(ev['format_rate'])} |"),
              (f"| max abs(teacher-forced − sampler log π(y)) | "
               f"{max(mech['logp_gap']):.1e} |")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, figs: list, out: str) -> None:
    """variance.png: the variance by baseline, the constant-baseline curve, b* against the
    mean reward per problem."""
    if not figs:
        return
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    width = 0.38
    for k, (metric, label) in enumerate((("var_ratio", "acc + 0.2 fmt"),
                                         ("var_ratio_acc", "accuracy"))):
        stats = [interval(arms[e]["metrics"][metric]) for e in ESTIMATORS]
        means, halves = common.error_bars(stats)
        ax.bar(np.arange(len(ESTIMATORS)) + (k - 0.5) * width, means,
               width, yerr=np.nan_to_num(halves), capsize=3, label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(ESTIMATORS)))
    ax.set_xticklabels(["none", "group\nmean", "RLOO", "b* LOO", "mean\nconst", "b*\nconst"],
                       fontsize=8)
    ax.set_ylabel("tr Cov / tr Cov(none)")
    ax.set_title("G-sample estimator variance, 95% CI over (base, seed)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    for kind, label in (("main", "acc + 0.2 fmt"), ("accuracy", "accuracy")):
        per = np.asarray([f[kind]["curve"] for f in figs], float)
        ax.plot(LAMBDAS, np.nanmean(per, 0), marker="o", ms=3, label=label)
        ax.fill_between(LAMBDAS, np.nanmin(per, 0), np.nanmax(per, 0), alpha=0.2)
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    ax.axvline(1, color="gray", lw=0.8)
    ax.set_xlabel("λ in b = mean + λ (b* − mean)  (0: mean, 1: b*)")
    ax.set_ylabel("single-sample tr Cov / (b = 0)")
    ax.set_title("constant baselines, cross-fitted (band: min-max)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[2]
    for index, f in enumerate(figs):
        points = np.asarray(f["main"]["per_prompt"], float).reshape(-1, 2)
        ax.scatter(points[:, 0], points[:, 1], s=8, alpha=0.6, color=f"C{index % 10}")
    ax.plot([0, 1.2], [0, 1.2], color="gray", lw=0.8)
    ax.set_xlabel("mean reward of the problem (its pool)")
    ax.set_ylabel("b* = E[r‖g‖²] / E[‖g‖²]")
    ax.set_title("b* against the mean, per problem (acc + 0.2 fmt)", fontsize=10)
    common.save_figure(fig, out, "variance.png")


def measure(runs: common.StudyRuns) -> None:
    """pool.npz for every finished run without one."""
    sizes = SIZES[runs.tier]
    measure_lib.measure_pools(runs, name=POOL_FILE, prompts=sizes["prompts"],
                              pool=sizes["pool"], prompts_per_call=sizes["prompts_per_call"],
                              grad_rows=sizes["grad_rows"])


# ---- the claims ----------------------------------------------------------------------------------

CS336 = "Stanford CS336 (Spring 2025), lecture 17 (policy gradient), 'Baselines'"
VAR_MARGIN = 0.1  # a tenth of the no-baseline variance: what 10% more samples buy
_G = SIZES["full"]["group"]
_OTHERS = SIZES["full"]["pool"] - _G  # the samples outside a group the constants are fitted on
# How a variance claim's test could fail here: a baseline helps only as far as it lies nearer
# b* than zero does, and b* moves off the mean reward only where the score norms go with the
# rewards.
_NORMS = ("the score norms ‖∇ log π(y | x)‖² (summed over the completion's tokens) of the "
          "correct and the wrong completions")
_NEAR_ZERO = ("if the completions that earn no accuracy (reward 0, or the format's 0.2 alone) "
              "carry much larger score norms ‖∇ log π(y | x)‖² than the correct ones, b* = "
              "E[r‖g‖²] / E[‖g‖²] lies near zero, and subtracting a mean reward gives those "
              "large-norm completions a coefficient of about minus that mean where no baseline "
              "gives them their own small reward: the variance can then rise above no "
              "baseline's")
CLAIMS = (
    common.Claim(
        "Idea: maximize the baselined reward: E[R - b(s)]. This is just E[R] shifted by a "
        "constant E[b(s)] that doesn't depend on the policy π",
        f"{CS336} (quoted); Williams 1992, Machine Learning 8; tested as: the update with "
        "the mean reward of the problem's other samples as b(s) has the expectation of the "
        "update without a baseline (⟨E ĝ, ∇J⟩ / ‖∇J‖² within ±1/G)",
        ("mean_const", "none", "bias_scale"), "=", margin=1 / 16, kind="check",
        can_fail="no: a baseline that does not depend on the sample leaves the expected "
                 "update unchanged by algebra; the test checks the measurement"),
    common.Claim(
        "The baseline must not depend on the sample it is subtracted from: the mean of the "
        "other samples (leave-one-out) is unbiased, the group mean including the sample is "
        "not (its expected update is (G - 1)/G of the gradient)",
        "Kool, van Hoof & Welling 2019, 'Buy 4 REINFORCE samples, get a baseline for free!', "
        "sec. 2; Ahmadian et al. 2024, arXiv:2402.14740, sec. 3 (paraphrase); tested as: "
        "GRPO's group mean's ⟨E ĝ, ∇J⟩ / ‖∇J‖² below no baseline's",
        ("group_mean", "none", "bias_scale"), "<", margin=1 / 32, kind="check",
        can_fail="no: the factor (G - 1)/G is exact algebra; the test checks that the "
                 "measurement resolves it",
        note="the factor (G - 1)/G is exact algebra (ĝ_mean = (G-1)/G ĝ_RLOO per group); the "
             "test asks whether the measurement resolves a 1/G = 6% bias"),
    common.Claim(
        "Optimal b*(s) = E[(∇ π(a | s))^2 R | s] / E[(∇ π(a | s))^2 | s] (for one-parameter "
        "models)",
        f"{CS336} (quoted); in many parameters b* = E[r ‖∇ log π‖²] / E[‖∇ log π‖²] "
        "minimises tr Cov (Greensmith, Bartlett & Baxter 2004, JMLR 5; Weaver & Tao 2001); "
        "tested as: b* fitted on the problem's other samples gives a lower variance than "
        "their mean reward", ("bstar_const", "mean_const", "var_ratio"), "<",
        margin=VAR_MARGIN,
        why=f"b* departs from the mean reward only as far as the rewards go with {_NORMS}; "
            "where those norms hardly differ, the two constants coincide and their variances "
            "lie within the margin, and b*, a ratio weighted by those norms and "
            f"fitted on the problem's {_OTHERS} samples outside the group, is the noisier "
            "estimate, whose error can cost it what it gains"),
    common.Claim(
        "This is difficult to compute... ...so heuristic is to use the mean reward: "
        "b(s) = E[R | s]",
        f"{CS336} (quoted; it follows the b* formula); tested as: the mean reward as the "
        "constant baseline does as well as b* (variance within 0.1 of the no-baseline "
        "variance)", ("bstar_const", "mean_const", "var_ratio"), "=", margin=VAR_MARGIN,
        why=f"where {_NORMS} differ (a completion the base finds unlikely tends to have the "
            "larger norm), b* moves off the mean reward towards the reward of the larger-norm "
            "completions, and the mean leaves those completions a large coefficient: its "
            "variance can then exceed b*'s by more than the margin",
        note="b* minus the mean reward is in the table below"),
    common.Claim(
        "In general, the baseline leaves the expected value of the update unchanged, but it "
        "can have a large effect on its variance [...] One natural choice for the baseline "
        "is an estimate of the state value",
        "Sutton & Barto 2018, Reinforcement Learning (2nd ed.), sec. 13.4; GRPO uses the "
        "group's mean reward in place of PPO's value baseline (Shao et al. 2024, "
        "arXiv:2402.03300, sec. 4.1); tested as: GRPO's group mean lowers the variance below "
        "no baseline's", ("group_mean", "none", "var_ratio"), "<", margin=VAR_MARGIN,
        why=f"the group's mean reward lowers the variance only where it lies nearer b* than "
            f"zero does; {_NEAR_ZERO}, and the mean's own noise over G = {_G} rewards adds "
            "to it"),
    common.Claim(
        "The leave-one-out mean of the other samples' rewards is a baseline that reduces the "
        "variance of REINFORCE without biasing it",
        "Kool, van Hoof & Welling 2019, sec. 2; Ahmadian et al. 2024, arXiv:2402.14740, "
        "sec. 3.2 (RLOO; paraphrase); tested as: RLOO's variance below no baseline's",
        ("rloo", "none", "var_ratio"), "<", margin=VAR_MARGIN,
        why=f"the mean of the group's {_G - 1} other rewards lowers the variance only where "
            f"it lies nearer b* than zero does; {_NEAR_ZERO}, and that mean's own noise "
            "adds to it"),
)

STUDY = common.Study(
    name="baselines",
    question="the variance of the policy-gradient estimator on the pretrained LM under no "
             "baseline, GRPO's group mean, leave-one-out (RLOO) and the optimal constant "
             "b* = E[r‖g‖²]/E[‖g‖²] (a measurement on the tier's bases, no training)",
    tiers=tiers.standard(
        full="about 30 min on 2 cores (estimated from the former "
             "script's 265-275 s per seed for 4,096 score functions, x 6 "
             "(base, seed) pairs, plus 6 held-out evaluations of the "
             "base; the two 9-min bases when not built yet)",
        mini="about 1 min on 2 cores (a toy base, 2 toy evaluations, "
             "2 pools of 4 problems x 16 samples; measured)",
        mini_seeds=(0, 1)),
    arms=(RUN_ARM,), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
