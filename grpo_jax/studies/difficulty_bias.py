"""Difficulty bias: how much of the update GRPO's std normalisation puts on prompts that are
nearly always or nearly never solved, against Dr. GRPO's unscaled advantages.

A measurement on pretrained bases (the main job's pretraining, shared with the other
studies), no training. Per (base, seed) the run `base_eval` evaluates the base on the
held-out problems (an eval stage only); `measure` then samples, from the base, a group of G
completions of each of P held-out problems (the first P of the main job's evaluation
problems, `task.eval_seed`: fixed across seeds; the sampling key is the seed's), scores them
with the task's accuracy (binary, so that p is the group's pass rate and the closed forms
apply) and reduces the per-sequence score functions g_i = grad log pi(y_i | x) to each
group's Gram matrix K (`groups.npz` in the run's directory; resumable). Sampling and score
functions are `measure.sample_scores`, as the baselines study's pools.

Per group, with the library's advantages (`losses.group_advantages`: GRPO scale="group",
the unbiased std plus 1e-6; Dr. GRPO scale="none"), two weights: the advantage weight
sum_i |A_i| and the norm of the group's gradient contribution ||sum_i A_i g_i|| =
sqrt(A^T K A) (the sequence's summed log-probs: no length normalisation, so only the std
differs between the two). For binary rewards sum_i |A_i| = 2 G p (1 - p) without the std and
2 G p (1 - p) / (s + eps) with it, s = sqrt(G / (G - 1) p (1 - p)) the group's unbiased std.

The analysis' arms: `grpo`, `dr_grpo` and `grpo_closed_form` (each method's share of its
total weight by bin of p: (0, 1/4], (1/4, 3/4), [3/4, 1)), and `grpo@middle`, `grpo@hard`
(GRPO's mean per-group weight in the middle and the hard bin, relative to its mean over
all groups with 0 < p < 1).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from grpo_jax import sweep
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.baselines import base_config, eval_config  # its runs

RUN_ARM = "base_eval"  # the baselines study's run (its eval_config), shared
POOL_FILE = "groups.npz"
BINS = (("hard", "(0, 0.25]", lambda p: (p > 0) & (p <= 0.25)),
        ("mid", "(0.25, 0.75)", lambda p: (p > 0.25) & (p < 0.75)),
        ("easy", "[0.75, 1)", lambda p: (p >= 0.75) & (p < 1)))
METHODS = ("grpo", "dr_grpo")
NAMES = {"grpo": "GRPO", "dr_grpo": "Dr. GRPO"}
MEASURES = ("adv", "closed", "grad", "grad_diag")
MEASURE_LABELS = {"adv": "Σ abs(A)", "closed": "Σ abs(A), closed form", "grad": "‖Σ A g‖",
                  "grad_diag": "sqrt(Σ A² ‖g‖²)"}
EPS = 1e-6
WEIGHTS = {"accuracy": 1.0}
SIZES = {"full": {"prompts": 128, "group": 16, "prompts_per_call": 32, "grad_rows": 16},
         "mini": {"prompts": 8, "group": 8, "prompts_per_call": 8, "grad_rows": 8}}


def arm_configs(tier: str) -> dict:
    return {RUN_ARM: eval_config(tier)}


def measure(runs: common.StudyRuns) -> None:
    """groups.npz for every finished run without one."""
    sizes = SIZES[runs.tier]
    measure_lib.measure_pools(runs, name=POOL_FILE, prompts=sizes["prompts"],
                              pool=sizes["group"], prompts_per_call=sizes["prompts_per_call"],
                              grad_rows=sizes["grad_rows"])


# ---- the per-seed figures -----------------------------------------------------------------------

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
        out[m] = {"adv": np.abs(a).sum(1), "closed": closed[m],
                  "grad": np.sqrt(np.maximum(np.einsum("ki,kij,kj->k", a, gram, a), 0)),
                  "grad_diag": np.sqrt((a ** 2 * diag).sum(1))}
    out["closed_form_gap"] = max(float(np.max(np.abs(out[m]["adv"] - closed[m])))
                                 for m in METHODS)
    # how aligned a group's score functions are: the off-diagonal share of ||sum A g||^2
    a = adv["dr_grpo"]
    full = np.einsum("ki,kij,kj->k", a, gram, a)
    out["offdiag_share"] = (float(np.sum(full - (a ** 2 * diag).sum(1)) / np.sum(full))
                            if np.sum(full) > 0 else math.nan)
    return out


def _share(weights: np.ndarray, mask: np.ndarray) -> float:
    total = weights.sum()
    return float(weights[mask].sum() / total) if total > 0 else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan


def seed_figures(acc: np.ndarray, gram: np.ndarray) -> dict:
    w = group_weights(acc, gram)
    p = w["p"]
    G = acc.shape[1]
    mixed = (p > 0) & (p < 1)
    fig = {"p0": float(np.mean(p == 0)), "p1": float(np.mean(p == 1)),
           "pass@1": float(acc.mean()), "closed_form_gap": w["closed_form_gap"],
           "offdiag_share": w["offdiag_share"], "groups": {}, "share": {}, "relative": {}}
    masks = {name: inside(p) for name, _, inside in BINS}
    masks["extreme"] = masks["hard"] | masks["easy"]
    for name, mask in masks.items():
        fig["groups"][name] = int(mask.sum())
        fig["groups"][name + "_share"] = (float(mask.sum() / mixed.sum()) if mixed.any()
                                          else math.nan)
        for m in METHODS:
            for measure in MEASURES:
                fig["share"][f"{m}/{measure}/{name}"] = _share(w[m][measure], mask)
                # the bin's mean per-group weight over the mean over all mixed groups
                fig["relative"][f"{m}/{measure}/{name}"] = (
                    _mean(w[m][measure][mask]) / _mean(w[m][measure][mixed])
                    if mixed.any() and _mean(w[m][measure][mixed]) > 0 else math.nan)
    # per group, weight ∝ (p (1 - p))^gamma over the groups with 0 < p < 1
    x = np.log(p[mixed] * (1 - p[mixed]))
    fig["gamma"] = {}
    for m in METHODS:
        for measure in MEASURES:
            y = w[m][measure][mixed]
            ok = y > 0
            fig["gamma"][f"{m}/{measure}"] = (float(np.polyfit(x[ok], np.log(y[ok]), 1)[0])
                                              if ok.sum() > 1 and np.ptp(x[ok]) > 0
                                              else math.nan)
    ks = np.arange(1, G)
    fig["by_k"] = {f"{m}/{measure}": [_mean(w[m][measure][np.isclose(p * G, k)]) for k in ks]
                   for m in METHODS for measure in MEASURES}
    fig["count_by_k"] = [int(np.isclose(p * G, k).sum()) for k in ks]
    return fig


# ---- the analysis -------------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    sizes = SIZES[runs.tier]
    records, pools = measure_lib.load_pools(runs.arm(RUN_ARM), POOL_FILE)
    figs = []
    for record, data in zip(records, pools):
        acc = measure_lib.task_rewards(data, WEIGHTS, runs.tier)
        fig = seed_figures(acc, np.asarray(data["gram"], np.float64))
        fig["eval"] = measure_lib.base_eval_values(record)
        figs.append(fig)
    arms = _arms(records, figs)
    specs = list(dict.fromkeys(c.test for c in CLAIMS if c.test is not None))
    note = (f"the measurement: the first {sizes['prompts']} held-out problems (task.eval_seed) "
            f"x a group of G = {sizes['group']} samples at temperature 1 (key: the seed), "
            f"accuracy reward; the arm {RUN_ARM}: the base's own held-out "
            f"evaluation (eval stage, task.eval_size problems)")
    protocol = measure_lib.pool_protocol(pools, records, sizes["group"], note, tier=runs.tier)
    extra = {"settings": {**sizes, "reward": "accuracy", "adv_eps": EPS},
             "per_seed": [{"base": r.base, "seed": r.seed,
                           **{k: v for k, v in f.items() if k not in ("by_k", "eval")}}
                          for r, f in zip(records, figs)]}
    return common.Analysis(arms=arms, specs=specs, table=table(figs, arms, sizes["group"]),
                           extra=extra, protocol=protocol,
                           plots=lambda out: plot(figs, out, sizes["group"]))


def _arms(records: list, figs: list) -> dict:
    def arm(metrics: dict) -> dict:
        return common.measured_arm(records, metrics)

    arms = {}
    for m in METHODS:
        metrics = {}
        for measure, suffix in (("adv", "adv"), ("grad", "grad")):
            for name in ("hard", "mid", "easy", "extreme"):
                key = "extreme_share" if name == "extreme" else f"share_{name}"
                metrics[f"{key}_{suffix}"] = [f["share"][f"{m}/{measure}/{name}"] for f in figs]
            metrics[f"gamma_{suffix}"] = [f["gamma"][f"{m}/{measure}"] for f in figs]
        arms[m] = arm(metrics)
    arms["grpo_closed_form"] = arm({
        **{(f"share_{name}_adv" if name != "extreme" else "extreme_share_adv"):
           [f["share"][f"grpo/closed/{name}"] for f in figs]
           for name in ("hard", "mid", "easy", "extreme")},
        "gamma_adv": [f["gamma"]["grpo/closed"] for f in figs]})
    for name in ("mid", "hard"):
        label = "grpo@middle" if name == "mid" else "grpo@hard"
        arms[label] = arm({"relative_grad": [f["relative"][f"grpo/grad/{name}"] for f in figs],
                           "relative_adv": [f["relative"][f"grpo/adv/{name}"] for f in figs]})
    arms[RUN_ARM] = arm({name: [f["eval"].get(name) for f in figs]
                         for name in measure_lib.BASE_EVAL})
    return arms


def _cell(values, scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
    return sweep.format_interval(interval(values), scale, digits, signed)


def _percent(values) -> str:
    text = _cell(values)
    return text if text == "-" else text + "%"


def table(figs: list, arms: dict, G: int) -> str:
    if not figs:
        return "No group measured yet.\n"

    def share(m, measure, name):
        return [f["share"][f"{m}/{measure}/{name}"] for f in figs]

    def diff(measure, name):
        return sweep.format_interval(paired_interval(share("grpo", measure, name),
                                                     share("dr_grpo", measure, name)),
                                     100.0, 1, True)

    n = len(figs)
    lines = [(f"Share of each method's total weight by bin of the group pass rate p (%, mean "
              f"± 95% t half-width over the {n} (base, seed) values; groups with p = 0 or 1 "
              "weigh 0 under both):"), "",
             ("| p | groups (share of 0 < p < 1) | GRPO Σ abs(A) | Dr. GRPO Σ abs(A) | GRPO, "
              "closed form | Dr. GRPO, closed form | GRPO ‖Σ A g‖ | Dr. GRPO ‖Σ A g‖ | GRPO − "
              "Dr. GRPO, Σ abs(A) (paired) | GRPO − Dr. GRPO, ‖Σ A g‖ (paired) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = [(name, label) for name, label, _ in BINS] + [("extreme", "(0, 0.25] and [0.75, 1)")]
    for name, label in rows:
        groups = "-" if name == "extreme" else _cell([f["groups"][name + "_share"]
                                                      for f in figs])
        lines.append(f"| {label} | {groups} | {_cell(share('grpo', 'adv', name))} | "
                     f"{_cell(share('dr_grpo', 'adv', name))} | "
                     f"{_cell(share('grpo', 'closed', name))} | "
                     f"{_cell(share('dr_grpo', 'closed', name))} | "
                     f"{_cell(share('grpo', 'grad', name))} | "
                     f"{_cell(share('dr_grpo', 'grad', name))} | {diff('adv', name)} | "
                     f"{diff('grad', name)} |")
    counts = "; ".join(f"{r} seed {s}: " + " / ".join(str(f["groups"][b]) for b in
                                                       ("hard", "mid", "easy"))
                       for r, s, f in zip(arms[RUN_ARM]["bases"], arms[RUN_ARM]["seeds"], figs))
    lines += ["", f"Groups in the bins per (base, seed): {counts}.", ""]

    def rel(m, measure, name):
        return [f["relative"][f"{m}/{measure}/{name}"] for f in figs]

    lines += [("Mean weight per group in a bin, relative to the method's mean over all "
               "groups with 0 < p < 1:"), "",
              "| p | GRPO Σ abs(A) | Dr. GRPO Σ abs(A) | GRPO ‖Σ A g‖ | Dr. GRPO ‖Σ A g‖ |",
              "|---|---|---|---|---|"]
    for name, label, _ in BINS:
        lines.append(f"| {label} | {_cell(rel('grpo', 'adv', name), 1, 2)} | "
                     f"{_cell(rel('dr_grpo', 'adv', name), 1, 2)} | "
                     f"{_cell(rel('grpo', 'grad', name), 1, 2)} | "
                     f"{_cell(rel('dr_grpo', 'grad', name), 1, 2)} |")
    lines += ["", ("Per-group weight against the pass rate, fitted as (p (1 − p))^γ over "
                   "the groups with 0 < p < 1 (closed forms: Σ abs(A) γ = 1 for Dr. GRPO, 1/2 "
                   "for GRPO; ‖Σ A g‖ with independent score functions of equal norm: 1/2 and "
                   "0):"), "",
              "| measure | GRPO γ | Dr. GRPO γ |", "|---|---|---|"]
    for measure in MEASURES:
        lines.append(f"| {MEASURE_LABELS[measure]} | "
                     f"{_cell([f['gamma']['grpo/' + measure] for f in figs], 1, 2)} | "
                     f"{_cell([f['gamma']['dr_grpo/' + measure] for f in figs], 1, 2)} |")
    ev = arms[RUN_ARM]["metrics"]
    lines += ["", "| quantity | value |", "|---|---|",
              f"| pass@1 of the sampled groups | {_percent([f['pass@1'] for f in figs])} |",
              (f"| groups with p = 0 / p = 1 | {_percent([f['p0'] for f in figs])} / "
               f"{_percent([f['p1'] for f in figs])} |"),
              (f"| max abs(Σ abs(A) − closed form) over groups | "
               f"{max(f['closed_form_gap'] for f in figs):.1e} |"),
              (f"| off-diagonal share of ‖Σ A g‖² (Dr. GRPO; 0: independent score functions) | "
               f"{_percent([f['offdiag_share'] for f in figs])} |"),
              (f"| the base's held-out evaluation ({RUN_ARM}): pass@1 / pass@8 | "
               f"{_percent(ev['pass@1'])} / {_percent(ev['pass@8'])} |")]
    return "\n".join(lines) + "\n"


def plot(figs: list, out: str, group: int) -> None:
    """weights.png: the per-group weight against p, and the shares by bin."""
    if not figs:
        return
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    p = np.arange(1, group) / group
    middle = (p > 0.25) & (p < 0.75)
    counts = np.sum([f["count_by_k"] for f in figs], 0)
    with warnings.catch_warnings():  # a pass rate no (base, seed) saw: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        by_k = {key: np.nanmean([f["by_k"][key] for f in figs], 0) for key in figs[0]["by_k"]}
    styles = {"grpo": "-", "dr_grpo": "--"}
    colors = {"adv": "C0", "grad": "C1", "grad_diag": "C2"}
    for m in METHODS:
        for measure in ("adv", "grad", "grad_diag"):
            y = np.asarray(by_k[f"{m}/{measure}"])
            norm = np.nansum(y[middle] * counts[middle]) / max(counts[middle].sum(), 1)
            if norm > 0:
                ax.plot(p, y / norm, styles[m], marker="o", ms=3, color=colors[measure],
                        label=f"{NAMES[m]}: {MEASURE_LABELS[measure]}")
    for m, curve in (("grpo", np.sqrt(p * (1 - p))), ("dr_grpo", p * (1 - p))):
        norm = np.sum(curve[middle] * counts[middle]) / max(counts[middle].sum(), 1)
        if norm > 0:
            ax.plot(p, curve / norm, styles[m], color="gray", lw=2, alpha=0.5,
                    label=f"closed form Σ|A| ({NAMES[m]})")
    ax.set_xlabel(f"group pass rate p (G = {group})")
    ax.set_ylabel("per-group weight / its mean over 0.25 < p < 0.75")
    ax.set_title("per-group weight against p (mean over (base, seed))", fontsize=10)
    ax.legend(fontsize=6)
    ax = axes[1]
    names = [name for name, _, _ in BINS]
    series = [(None, "groups"), ("grpo/adv", "GRPO Σ|A|"), ("dr_grpo/adv", "Dr. GRPO Σ|A|"),
              ("grpo/grad", "GRPO ‖ΣAg‖"), ("dr_grpo/grad", "Dr. GRPO ‖ΣAg‖")]
    width = 0.16
    for index, (key, label) in enumerate(series):
        stats = [interval([f["groups"][name + "_share"] if key is None
                           else f["share"][f"{key}/{name}"] for f in figs])
                 for name in names]
        means, halves = common.error_bars(stats, 100)
        ax.bar(np.arange(len(names)) + (index - 2) * width, means,
               width, yerr=np.nan_to_num(halves), capsize=2, label=label)
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels([f"p in {label}" for _, label, _ in BINS])
    ax.set_ylabel("share of the total weight (%)")
    ax.set_title("share by bin, 95% CI over (base, seed)", fontsize=10)
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "weights.png")


# ---- the claims ---------------------------------------------------------------------------------

DR_GRPO = "Liu et al. 2025 (Dr. GRPO), arXiv:2503.20783, sec. 3.1, question-level difficulty bias"
DAI = "Dai et al. 2026 (MathForge), arXiv:2601.20614"
SHARE_MARGIN = 0.02  # 2 points of the update's total weight
_G = SIZES["full"]["group"]
# The sign of the two share claims is algebra (GRPO divides each group's weight by its std,
# smaller in every extreme group than in any middle one); what could fail is their size.
_SIGN = ("GRPO divides each group's weight by the group's std, which is smaller in every "
         "group with p ≤ 1/4 or p ≥ 3/4 than in any middle one, so the sign is algebra; the "
         "size is not")
CLAIMS = (
    common.Claim(
        "questions with lower standard deviations (e.g., too easy or too hard questions with "
        "outcome rewards being almost all 1 or 0) are given higher weights during policy "
        "updates",
        f"{DR_GRPO} (near-verbatim); tested as: GRPO's share of the advantage weight Σ abs(A) "
        "on the groups with p ≤ 1/4 or p ≥ 3/4 above Dr. GRPO's",
        ("grpo", "dr_grpo", "extreme_share_adv"), ">", margin=SHARE_MARGIN,
        why=f"{_SIGN}: if nearly all of the base's mixed groups lie on one side of the bin "
            "edges (a base that solves few problems puts most of them in the hard bin), both "
            "methods' extreme shares lie near 1 (or 0) and differ by less than the margin, "
            f"and groups near the edges (p = {_G // 4}/{_G} against {_G // 4 + 1}/{_G}) get "
            "nearly the same factor"),
    common.Claim(
        "The same holds for the gradient each group contributes, not only for its advantage "
        "weights",
        f"this study's extension of {DR_GRPO}; tested as: GRPO's share of Σ ‖Σ_i A_i ∇ log "
        "π(y_i | x)‖ on the groups with p ≤ 1/4 or p ≥ 3/4 above Dr. GRPO's",
        ("grpo", "dr_grpo", "extreme_share_grad"), ">", margin=SHARE_MARGIN,
        why=f"{_SIGN}: as for Σ abs(A), if nearly all mixed groups lie in one kind of bin, "
            "and here also if the extreme groups' gradients are much smaller (or larger) than "
            "the middle ones' (the score functions, not the advantages alone), the extreme "
            "bins hold a share near 0 (or 1) of the gradient under both methods, and GRPO's "
            "factor moves it by less than the margin"),
    common.Claim(
        "For binary rewards a group's advantage weight is Σ abs(A) = 2G sqrt(p(1 - p)) with "
        "GRPO's std (times sqrt((G - 1)/G) with the unbiased std) and 2G p(1 - p) without",
        f"the closed form, derived in this study's README (the same expression: {DAI}); "
        "tested as: the shares by bin of the library's advantages (losses.group_advantages) "
        "equal the closed form's within 0.1 point",
        ("grpo", "grpo_closed_form", "extreme_share_adv"), "=", margin=0.001, kind="check",
        can_fail="no: an identity; the test checks the library's advantages against it"),
    common.Claim(
        "widely used Group Relative Policy Optimization (GRPO) suffers from an implicit "
        "imbalance where the magnitude of policy updates is lower for harder questions",
        f"{DAI}, abstract (quoted); tested as: under GRPO the mean gradient norm per group "
        "with 1/4 < p < 3/4 above that with 0 < p ≤ 1/4, each relative to the mean over all "
        "groups with 0 < p < 1", ("grpo@middle", "grpo@hard", "relative_grad"), ">",
        margin=0.05,
        why="with the unbiased std, Σ A_i² = G - 1 in every mixed group, so GRPO's gradient "
            "norm per group differs between bins only through the score functions its "
            "advantages fall on: in a hard group most of Σ A_i² sits on the one or few "
            "correct completions, in a middle group it is spread over all; if those rare "
            "correct completions, which the base seldom samples, carry larger score norms "
            "‖∇ log π(y | x)‖² than the average completion, or the middle groups' score "
            "functions cancel more, the hard groups' norm reaches the middle ones'"),
)

STUDY = common.Study(
    name="difficulty_bias",
    question="the share of the update on prompts with pass rate p in (0, 1/4], (1/4, 3/4), "
             "[3/4, 1) under GRPO's std-scaled advantages and Dr. GRPO's (Σ abs(A) and the "
             "gradient norm; a measurement on the tier's bases, no training)",
    tiers=tiers.standard(
        full="about 9 min on 2 cores (estimated from the former script's "
             "63-85 s per seed for 2,048 score functions, x 6 (base, seed) "
             "pairs, plus 6 held-out evaluations of the base; the two "
             "9-min bases when not built yet)",
        mini="about 1 min on 2 cores (a toy base, 2 toy evaluations, 2 "
             "measurements of 8 problems x 8 samples; measured)",
        mini_seeds=(0, 1)),
    arms=(RUN_ARM,), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
