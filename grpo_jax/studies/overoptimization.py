"""Reward-model overoptimization: the gold reward against the KL moved, under GRPO on a learned
reward model's score at several KL coefficients (Gao, Schulman and Hilton 2022,
arXiv:2210.10760; the tutorial's "the KL penalty keeps the policy from exploiting the reward
model").

From the main base (configs/default.py's pretraining; the full tier's base seeds,
`tiers.FULL_BASES`), every run is reward_hacking's `reward model` arm (a Bradley-Terry reward
model trained from the base, stage `rm`; the held-out evaluation; the main job's GRPO stage on
the reward model's score alone, accuracy and format logged with weight 0; the evaluation
again) with the KL coefficient `rl.beta` of its arm (`BETAS`):

* `beta=0.001`: the unpenalised end. At β = 0 the RL stage keeps no reference model and logs
  no KL, so the smallest arm is a tenth of GRPO's default instead: its k3 term's gradient
  weight per token, β |1 - π_ref/π|, is below a thousandth of the policy gradient's |A|
  (on kl_beta's figures of |1 - π_ref/π| and |A| under the rule reward);
* `beta=0.01`: GRPO's default (`rl.beta` left unset): reward_hacking's `reward model` arm
  itself, one config, so its runs are shared;
* `beta=1`: a penalty that holds the policy near the base (kl_beta's β = 1 arm, under the
  rule reward, ended at a fraction of the unpenalised arm's KL; β = 0.1 moved it little),
  so the KL reached differs across the arms by a factor, which both the tutorial's claim
  and Gao et al.'s early-stopping reading need.

Measured, from what the RL stage logs per step in metrics.jsonl (no measurement of its own):
the gold reward, `reward/accuracy` (the rule's verdict on the step's completions, weight 0
in the reward); the proxy, `reward/reward_model`; and the KL to the reference, `kl_ref` (the
token mean of k3 over the step's completions, at the parameters that sampled them). The
sequence KL is kl_ref x `completion_length` (the mean completion tokens per sample), and
d = sqrt(sequence KL), Gao et al.'s distance (nats^0.5). Per run, the steps cut into
consecutive windows of `WINDOW` steps (`windows`; a quarter of the steps at the mini tier),
each window's mean d and mean gold:

* the fit (least squares, `fit_rl_form`): gold = g0 + d (alpha - beta_g ln d), Gao et al.'s
  R_RL(d) = d (alpha - beta ln d) for the gain over the initial policy, with the initial gold
  g0 fitted with it (the first step's is one batch's noisy sample): `fit_alpha`,
  `fit_beta_g`, `fit_r2`; the peak `d_star` = exp(alpha / beta_g - 1) (a maximum only when
  beta_g > 0), `gain_star` = R(d*) = beta_g d* (the gold gained at the peak), `peak_inside`
  (1 when beta_g > 0 and d* lies below the largest window d, `d_max`); over [0, d_max] the
  fitted curve's `rise` (its maximum over the start) and `fall` (its maximum over its value at
  d_max), and `rise_fall` = min(rise, fall): the gold a curve gains before its peak and loses
  after it inside the observed range (0 when it is monotone there). `fit_r2_bon`: R² of the
  best-of-n form g0 + d (alpha - beta d) on the same points, descriptive;
* `gold_matched`: the gold at the matched distance d_match of its (base, seed), the smallest
  of the arms' d_max (the farthest distance every arm reached), read off the run's points
  (its first step's d and gold, then its window points) by linear interpolation at the first
  crossing (`gold_at`); `gain_matched` is it less the run's first-step gold (`gold_start`);
* `d_final`: the last window's mean d; `rm_gain` and `gold_gain`: the change of the proxy and
  of the gold from the first step to the last window;
* held-out pass@1 (the final gold on held-out problems) and the format rate, from the run's
  final evaluation.

Figures: `frontier.png` (per arm, each run's window points of the gold and the proxy against
d, and the fitted gold curve) and `curves.png` (proxy, gold and kl_ref over the steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from grpo_jax.studies import common, reward_hacking, tables, tiers
from grpo_jax.studies.arms import per_arm

BETAS = {"beta=0.001": 0.001, "beta=0.01": None, "beta=1": 1.0}  # None: GRPO's default
LOW, DEFAULT, HIGH = tuple(BETAS)
ARMS = tuple(BETAS)
NO_CHANGE, NO_FIT = "no change", "no fit"  # pseudo-arms: fixed bars (`common.constant_arm`)
WINDOW = 10  # steps per point of a run's gold-against-d curve
MINI_STEPS = 8  # the mini tier's RL steps (enough windows to run the fit)
GOLD, PROXY = "reward/accuracy", "reward/reward_model"
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03  # held-out pass@1, as the other studies
GOLD_MARGIN = 0.03  # training accuracy (the gold): three points, as pass@1's
R2_BAR = 0.7  # fit_r2: the fit explains at least seven tenths of the windows' variance
D_MARGIN = 0.1  # d_final, nats^0.5: the check that the penalty holds the policy nearer
SPECS = [(LOW, NO_CHANGE, "rise_fall"), (LOW, NO_FIT, "fit_r2"), (HIGH, LOW, "pass@1"),
         (HIGH, LOW, "gold_matched"), (HIGH, LOW, "d_final"), (DEFAULT, LOW, "pass@1"),
         (DEFAULT, LOW, "gold_matched")]

base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: reward_hacking's `reward model` arm
    (the reward model, the held-out evaluation, GRPO on its score, the evaluation again) with
    the arm's `rl.beta` (the default arm leaves it unset: reward_hacking's run itself)."""
    if arm not in BETAS:
        raise ValueError(f"overoptimization: unknown arm {arm!r}; expected one of {ARMS}")
    config = reward_hacking.arm_config(reward_hacking.MODEL, tier)
    if BETAS[arm] is not None:
        config.rl.beta = BETAS[arm]
    if tier != "full":
        config.rl.steps = MINI_STEPS
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


# ---- the curve and its fit ------------------------------------------------------------------

def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def distances(rows: Sequence[dict]) -> list[float]:
    """Per training row, d = sqrt(kl_ref x completion_length): the square root of the
    sequence KL to the reference (NaN where either is missing)."""
    out = []
    for row in rows:
        kl, length = row.get("kl_ref"), row.get("completion_length")
        if _finite(kl) and _finite(length):
            out.append(math.sqrt(max(0.0, float(kl) * float(length))))
        else:
            out.append(math.nan)
    return out


def windows(values: Sequence[float], window: int) -> list[float]:
    """The means of consecutive windows of `window` values (a last, shorter window left out;
    non-finite values left out of a mean, NaN without any)."""
    out = []
    for start in range(0, len(values) - window + 1, window):
        kept = [float(v) for v in values[start:start + window] if _finite(v)]
        out.append(sum(kept) / len(kept) if kept else math.nan)
    return out


def window_of(steps: int) -> int:
    """The window of a run of `steps` RL steps: `WINDOW`, or a quarter of the steps when
    that leaves fewer than four windows (the mini tier)."""
    return max(1, min(WINDOW, steps // 4))


def curve_points(rows: Sequence[dict]) -> tuple[list[float], list[float], list[float]]:
    """A run's window points: (mean d, mean gold, mean proxy) per window of `window_of`."""
    window = window_of(len(rows))
    return (windows(distances(rows), window),
            windows([r.get(GOLD) for r in rows], window),
            windows([r.get(PROXY) for r in rows], window))


def _xlogx(d: float) -> float:
    return d * math.log(d) if d > 0 else 0.0


def _lstsq(columns: Sequence[Sequence[float]], y: Sequence[float]):
    """(coefficients, R²) of the least squares of y on `columns` (the first a constant);
    None when the system is rank-deficient."""
    import numpy as np

    matrix = np.asarray(columns, dtype=np.float64).T
    target = np.asarray(y, dtype=np.float64)
    coef, _, rank, _ = np.linalg.lstsq(matrix, target, rcond=None)
    if rank < matrix.shape[1]:
        return None
    total = float(np.sum((target - target.mean()) ** 2))
    residual = float(np.sum((target - matrix @ coef) ** 2))
    return [float(c) for c in coef], (1.0 - residual / total if total > 0 else math.nan)


def gain(d: float, alpha: float, beta_g: float) -> float:
    """Gao et al.'s R_RL(d) = d (alpha - beta_g ln d), 0 at d = 0."""
    return alpha * d - beta_g * _xlogx(d)


def peak(alpha: float, beta_g: float, d_max: float) -> dict:
    """The fitted curve's peak and its shape over [0, d_max]: `d_star` = exp(alpha / beta_g -
    1) and `gain_star` = R(d*) = beta_g d* (NaN unless beta_g > 0: no maximum), `peak_inside`
    (1.0 when beta_g > 0 and d* < d_max), `rise` = max R over [0, d_max] - R(0), `fall` = that
    maximum - R(d_max), `rise_fall` = min(rise, fall)."""
    nan = math.nan
    if not all(_finite(v) for v in (alpha, beta_g, d_max)) or d_max <= 0:
        return {"d_star": nan, "gain_star": nan, "peak_inside": nan, "rise": nan,
                "fall": nan, "rise_fall": nan}
    d_star = gain_star = nan
    if beta_g > 0:
        exponent = alpha / beta_g - 1.0
        d_star = math.exp(exponent) if exponent < 700 else math.inf
        gain_star = beta_g * d_star
    inside = beta_g > 0 and d_star < d_max
    end = gain(d_max, alpha, beta_g)
    # R is concave on (0, inf) when beta_g > 0 (its maximum at d*), convex when beta_g < 0
    # and linear at 0: otherwise the maximum over [0, d_max] lies at an end
    top = gain_star if inside else max(0.0, end)
    rise, fall = top, top - end
    return {"d_star": d_star, "gain_star": gain_star, "peak_inside": 1.0 if inside else 0.0,
            "rise": rise, "fall": fall, "rise_fall": min(rise, fall)}


def fit_rl_form(d: Sequence[float], gold: Sequence[float]) -> dict:
    """Least squares of gold = g0 + d (alpha - beta_g ln d) over points (d, gold), d >= 0.

    Linear in (g0, alpha, beta_g): the columns 1, d and -d ln d (0 at d = 0). R² = 1 - SS_res
    / SS_tot over the points. Non-finite or negative-d points are left out; fewer than four
    points, or columns without spread, give NaN. With the peak's figures (`peak`) over [0, the
    largest d].

    Returns:
      {"g0", "alpha", "beta_g", "r2", "n", "d_max", "d_star", "gain_star", "peak_inside",
       "rise", "fall", "rise_fall"}.
    """
    pairs = [(float(x), float(y)) for x, y in zip(d, gold)
             if _finite(x) and _finite(y) and x >= 0]
    n = len(pairs)
    nan = math.nan
    out = {"g0": nan, "alpha": nan, "beta_g": nan, "r2": nan, "n": n, "d_max": nan,
           **peak(nan, nan, nan)}
    if n < 4:
        return out
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    found = _lstsq([[1.0] * n, xs, [-_xlogx(x) for x in xs]], ys)
    if found is None or not math.isfinite(found[1]):
        return out
    (g0, alpha, beta_g), r2 = found
    d_max = max(xs)
    return {"g0": g0, "alpha": alpha, "beta_g": beta_g, "r2": r2, "n": n, "d_max": d_max,
            **peak(alpha, beta_g, d_max)}


def fit_bon_r2(d: Sequence[float], gold: Sequence[float]) -> float:
    """R² of the least squares of gold = g0 + d (alpha - beta d) (Gao et al.'s best-of-n form)
    over the same points as `fit_rl_form` (NaN where it gives NaN)."""
    pairs = [(float(x), float(y)) for x, y in zip(d, gold)
             if _finite(x) and _finite(y) and x >= 0]
    if len(pairs) < 4:
        return math.nan
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    found = _lstsq([[1.0] * len(xs), xs, [-x * x for x in xs]], ys)
    return found[1] if found is not None else math.nan


def gold_at(d: Sequence[float], gold: Sequence[float], target: float) -> float:
    """The gold where a run's window points (in training order) first reach the distance
    `target`: linear interpolation between the last point below it and the first at or past
    it (the first point's gold when that one already is); NaN when no point reaches it."""
    points = [(float(x), float(y)) for x, y in zip(d, gold) if _finite(x) and _finite(y)]
    if not _finite(target):
        return math.nan
    for index, (x, y) in enumerate(points):
        if x >= target:
            if index == 0:
                return y
            x0, y0 = points[index - 1]
            return y0 + (y - y0) * (target - x0) / (x - x0)
    return math.nan


def matched_distance(d_max: Sequence[float]) -> float:
    """The farthest distance every arm of one (base, seed) reached: the smallest of their
    largest window d (NaN without any)."""
    finite = [float(v) for v in d_max if _finite(v)]
    return min(finite) if finite else math.nan


# ---- the analysis ---------------------------------------------------------------------------

def _rl_rows(record) -> list[dict]:
    return [r for r in common.training_rows(record) if r.get("stage", "rl") == "rl"]


def curve_values(rows: Sequence[dict], d_match: float = math.nan) -> dict:
    """A run's curve figures (the module's docstring) from its RL training rows, its gold
    read at `d_match`."""
    if not rows:
        return {}
    d, gold, proxy = curve_points(rows)
    fit = fit_rl_form(d, gold)
    start = rows[0].get(GOLD)
    start = float(start) if _finite(start) else math.nan
    proxy_start = rows[0].get(PROXY)
    proxy_start = float(proxy_start) if _finite(proxy_start) else math.nan
    # the first step (d near 0: the policy is the reference) before the window points, so a
    # matched distance short of the first window's mean d is read between the two
    matched = gold_at(distances(rows[:1]) + d, [start] + gold, d_match)
    values = {"fit_g0": fit["g0"], "fit_alpha": fit["alpha"], "fit_beta_g": fit["beta_g"],
              "fit_r2": fit["r2"], "fit_r2_bon": fit_bon_r2(d, gold), "d_max": fit["d_max"],
              "d_star": fit["d_star"], "gain_star": fit["gain_star"],
              "peak_inside": fit["peak_inside"], "rise": fit["rise"], "fall": fit["fall"],
              "rise_fall": fit["rise_fall"], "gold_start": start,
              "gold_end": gold[-1] if gold else math.nan,
              "gold_gain": (gold[-1] - start) if gold else math.nan,
              "rm_gain": (proxy[-1] - proxy_start) if proxy else math.nan,
              "d_final": d[-1] if d else math.nan, "d_match": d_match,
              "gold_matched": matched, "gain_matched": matched - start}
    return {k: (float(v) if _finite(v) else None) for k, v in values.items()}


def matched_distances(runs: common.StudyRuns) -> dict:
    """{(base, seed): the matched distance} over the finished runs of the study's arms."""
    reached: dict = {}
    for record in runs.runs:
        if record.finished and record.arm in ARMS:
            d = curve_points(_rl_rows(record))[0]
            reached.setdefault((record.base, record.seed), []).append(
                max((x for x in d if _finite(x)), default=math.nan))
    return {key: matched_distance(values) for key, values in reached.items()}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    matched = matched_distances(runs)

    def values(record) -> dict:
        return {**common.eval_values(record, METRICS),
                **curve_values(_rl_rows(record),
                               matched.get((record.base, record.seed), math.nan))}

    arms = per_arm(runs, values, ARMS)
    common.add_base_arm(arms, DEFAULT if DEFAULT in arms else LOW, METRICS)
    common.constant_arm(arms, LOW, NO_CHANGE, "rise_fall", 0.0)
    common.constant_arm(arms, LOW, NO_FIT, "fit_r2", 0.0)
    points = {arm: [curve_points(_rl_rows(r)) for r in runs.arm(arm) if r.finished]
              for arm in ARMS}
    curves = tables.curve_plots(runs, ARMS, ((PROXY, "reward model score (the proxy)"),
                                             (GOLD, "training accuracy (the gold)"),
                                             ("kl_ref", "kl_ref (k3 per token)")))

    def plots(out: str) -> None:
        curves(out)
        plot_frontier(points, out)

    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms),
        extra={"fit": {"window_steps": WINDOW, "model": "gold = g0 + d (alpha - beta_g ln d)",
                       "d": "sqrt(kl_ref x completion_length), window mean",
                       "gold": f"{GOLD} (window mean)"},
               "betas": {arm: ("GRPO's default (rl.beta unset)" if beta is None else beta)
                         for arm, beta in BETAS.items()}},
        protocol={"notes": "the gold, the proxy and the KL as the RL stage logs them per "
                           f"step; the curve over windows of {WINDOW} steps"},
        plots=plots,
        scales={"fit_r2": (1.0, 3), "d_final": (1.0, 3), "rise_fall": (100.0, 1),
                "gold_matched": (100.0, 1)})


def plot_frontier(points: dict, out: str, name: str = "frontier.png") -> None:
    """`out/name`: per arm, each run's window points of the gold (dots) and the proxy
    (crosses, its own axis) against d, and the fitted gold curve."""
    import numpy as np

    plt = common.pyplot()
    arms = [arm for arm in ARMS if points.get(arm)]
    if not arms:
        return
    fig, axes = plt.subplots(1, len(arms), figsize=(4.4 * len(arms), 3.4), squeeze=False,
                             sharex=True, sharey=True)  # one frontier: the arms' axes alike
    for ax, arm in zip(axes[0], arms):
        proxy_ax = ax.twinx()
        for index, (d, gold, proxy) in enumerate(points[arm]):
            color = f"C{index % 10}"
            ax.plot(d, [100.0 * g for g in gold], "o", ms=3, color=color)
            proxy_ax.plot(d, proxy, "x", ms=3, color=color, alpha=0.5)
            fit = fit_rl_form(d, gold)
            if _finite(fit["r2"]):
                grid = np.linspace(0.0, fit["d_max"], 60)
                ax.plot(grid, [100.0 * (fit["g0"] + gain(x, fit["alpha"], fit["beta_g"]))
                               for x in grid], "-", lw=1, color=color)
        ax.set_title(f"{arm}: gold (o, fit) and proxy (x) against d", fontsize=9)
        ax.set_xlabel("d = sqrt(KL to the reference), nats^0.5")
        ax.set_ylabel("training accuracy, %")
        proxy_ax.set_ylabel("reward model score")
    common.save_figure(fig, out, name)


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, (*ARMS, "base"),
        ("pass@1", "gold start", "gold end", "proxy change", "d final", "fit R²",
         "best-of-n form R²", "alpha", "beta_g", "peak inside", "d*", "gold gain at d*",
         "rise, then fall", "d matched", "gold at d matched"),
        tables.metric_row("pass@1", "gold_start", "gold_end", ("rm_gain", 1.0, 3),
                          ("d_final", 1.0, 3), ("fit_r2", 1.0, 2), ("fit_r2_bon", 1.0, 2),
                          ("fit_alpha", 1.0, 3), ("fit_beta_g", 1.0, 3), "peak_inside",
                          ("d_star", 1.0, 3), "gain_star", "rise_fall", ("d_match", 1.0, 3),
                          "gold_matched"),
        "held-out pass@1 and the gold (training accuracy) in %; the proxy (the reward "
        "model's score) in its own units, its change from the first step to the last window; "
        f"d = sqrt(KL to the reference per sequence) in nats^0.5, windows of {WINDOW} steps "
        "(a quarter of the steps when fewer); "
        "the fit gold = g0 + d (alpha - beta_g ln d) per run (alpha and beta_g in gold "
        "fraction per nats^0.5), its peak d* = exp(alpha / beta_g - 1) and the gold gained "
        "there (runs with beta_g > 0 only), `peak inside` the share of runs whose peak lies "
        "inside the observed d, `rise, then fall` the smaller of the fitted curve's rise "
        "before its peak and fall after it over the observed d (%); `d matched` the farthest "
        "d every arm of the (base, seed) reached; mean ± 95% half-width over (base, seed) "
        "runs.", first="arm")


GAO = ("Gao, Schulman and Hilton 2022, \"Scaling Laws for Reward Model Overoptimization\", "
       "arXiv:2210.10760")
ABSTRACT = GAO + ", abstract"
KL_SECTION = (GAO + ", the section on the KL penalty's effect (close paraphrase; its words "
              "and section number not checked here)")
TUTORIAL = ("the tutorial on policy gradient to R1 (paraphrase): \"the KL penalty keeps the "
            "policy from exploiting the reward model\"")
CLAIMS = (
    common.Claim("Because the reward model is an imperfect proxy, optimizing its value too "
                 "much can hinder ground truth performance", ABSTRACT + "; tested as the "
                 "fitted gold curve rising then falling inside the observed KL under GRPO "
                 "on the reward model without a penalty in effect: the smaller of its rise "
                 "before the peak and its fall after it, against no change",
                 (LOW, NO_CHANGE, "rise_fall"), ">", margin=GOLD_MARGIN,
                 can_fail="fails unless the fitted gold curve of the near-unpenalised arm "
                          f"both rises and falls by at least {100 * GOLD_MARGIN:g} points "
                          "inside the KL it reached (mean over runs, Holm p < 0.05, no base "
                          "below): a curve "
                          "that only rises (the reward model tracks correctness over the "
                          "whole run), only falls (hacked from the first steps), or turns "
                          "past the last step gives 0",
                 note="the gold is the rule's accuracy on the training completions (Gao et "
                      "al.'s is a larger gold reward model's score)"),
    common.Claim("for reinforcement learning, R_RL(d) = d(α_RL − β_RL log d)", GAO + ", sec. 1 "
                 "(quotation; d = sqrt(KL(π ‖ π_init)), R the gold score's gain; the abstract's "
                 "\"a different functional form depending on the method of optimization\", of "
                 "which only the RL half is tested here); tested per run as the R² of that form "
                 "(with the initial gold fitted) over windows of steps, against no fit (R² "
                 "0), the margin the bar the mean R² must reach",
                 (LOW, NO_FIT, "fit_r2"), ">", margin=R2_BAR,
                 can_fail="fails unless the mean R² of the near-unpenalised arm's runs "
                          f"reaches {R2_BAR:g}: low when the gold hardly moves against the "
                          "windows' noise, or moves in a shape the form cannot take (a fall and a "
                          "recovery, a step)",
                 note="with few windows and three coefficients, other smooth forms fit "
                      "about as well (the best-of-n form's R² is in the table): the R² says "
                      "the form describes the curve, not that it is the only one that does"),
    common.Claim("the KL penalty keeps the policy from exploiting the reward model",
                 TUTORIAL + "; tested as held-out pass@1 (the final gold) at β = 1 against "
                 "β = 0.001", (HIGH, LOW, "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail=f"fails unless β = 1 ends at least {100 * PASS_MARGIN:g} points of "
                          "held-out pass@1 above β = 0.001 (Holm p < 0.05, no base below): "
                          "when the reward "
                          "model is not exploited within the run, the penalty only slows "
                          "the climb and ends lower"),
    common.Claim("the KL penalty does not improve the gold reward model score against KL "
                 "frontier; it acts like early stopping", KL_SECTION + "; tested as the "
                 "gold at the matched KL of each (base, seed) (the farthest every arm "
                 "reached), β = 1 against β = 0.001, equal within the margin",
                 (HIGH, LOW, "gold_matched"), "=", margin=GOLD_MARGIN,
                 headroom=(LOW, "gain_matched", 0.0),
                 can_fail="fails if the 95% interval of the gold at the matched KL, β = 1 "
                          f"less β = 0.001, reaches past ±{100 * GOLD_MARGIN:g} points; not "
                          "testable here when the near-unpenalised arm's gold has moved "
                          "less than the margin from its start by the matched KL (equal by "
                          "construction there: the headroom)"),
    common.Claim("a KL penalty holds the policy nearer the reference", TUTORIAL + "; the "
                 "mechanism its claim rests on, tested as the last window's d at β = 1 "
                 "against β = 0.001",
                 (HIGH, LOW, "d_final"), "<", margin=D_MARGIN, kind="check",
                 can_fail="a check, not a claim: the penalty's gradient lowers this KL, so "
                          "the arm ends nearer the reference by construction; it fails only "
                          "if the unpenalised arm hardly moves either"),
)

STUDY = common.Study(
    name="overoptimization",
    question="under GRPO on a learned reward model's score, does the gold reward (the rule's "
             "accuracy) rise and then fall with the KL moved, along d (alpha - beta log d), "
             "does a larger KL coefficient end with a higher gold, and is the gold at equal "
             "KL the same whatever the coefficient, paired by seed?",
    tiers=tiers.standard(
        full="about 2.4 hours on 2 cores for 24 runs, estimated, not yet run (runs of about "
             "6 min each with its reward model, reward_hacking's figure: 4253 s for 12 "
             "runs); β = 0.01's eight are reward_hacking's `reward model` arm, so about 1.6 "
             "hours beyond that study; plus the shared main bases when not built yet",
        mini="about 35 s on 2 cores (measured: 32 s in the suite under a load of about 7, the "
             "toy base built in; one seed, 2 toy runs, β = 0.001 and β = 1)",
        mini_arms=(LOW, HIGH), full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
