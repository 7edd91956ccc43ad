"""Policy entropy over GRPO training: does it collapse, does clip-higher or an entropy bonus keep
it, and is training performance a function of it along R = -a exp(H) + b (Cui et al. 2025)?
On two task families: arithmetic (the main job) and reasoning-gym's `spell_backward` (a word
of 3-5 letters spelled backward; `families.SECOND`), so that what the entropy does under GRPO
can be told from what it does on the arithmetic task.

Arithmetic, from the main base (configs/default.py's pretraining; the full tier's base seeds,
`tiers.FULL_BASES`), four arms of the main job's GRPO stage:

* `GRPO`: the main job's GRPO arm as it is (the run forking_tokens' `all` arm makes: one
  config, computed once);
* `entropy bonus`: the same with `rl.entropy_coef` = `ENTROPY_COEF` (the loss subtracts
  ENTROPY_COEF x the token entropy), one value fixed before the runs (see `ENTROPY_COEF`);
* `GRPO, multi-pass`: updates_per_batch's `mu=4, lr=1e-3` arm (the same config, so the same
  runs): four clipped passes over each rollout batch at five times the main job's learning
  rate, where PPO's clip binds on tokens;
* `clip-higher, multi-pass`: the same with `rl.epsilon_high` = `EPSILON_HIGH` (DAPO's upper
  clip range; the lower one stays 0.2).

spell_backward, from the family's base of each base seed (the preset's pretraining,
configs/reasoning_gym_tasks.py: tiny-1m on noisy worked solutions, 800 steps; role
"spell_backward:base" of the base set `families.with_family` builds, shared with every study
that runs on the family), the same four arms of the preset's GRPO stage (40 steps of 32
prompts x 8 completions, rewards scored on the host: the dataset's partial-credit score,
the share of letters in place, + 0.2 x format), each named "spell_backward: <arm>"
(`families.arm_name`):

* `spell_backward: GRPO`: the preset's GRPO stage as it is (`families.grpo`: the same config
  as replication's `spell_backward: all`, so the same runs);
* `spell_backward: entropy bonus`: the same with `rl.entropy_coef` = `ENTROPY_COEF`;
* `spell_backward: GRPO, multi-pass`: the preset's stage with the changes updates_per_batch's
  `mu=4, lr=1e-3` arm makes to the main job: four updates per batch (`rl.num_iterations`)
  and the learning rate times `lr_factor` (1e-3 over the main job's 2e-4: five, so the
  preset's 2e-4 becomes 1e-3; the preset already runs on the host loop, `rl.fused_steps` 0);
* `spell_backward: clip-higher, multi-pass`: the same with `rl.epsilon_high` = `EPSILON_HIGH`.

At the mini tier the study runs the arithmetic arms only, from the main base alone (the
family's toy base and runs would double the suite's time); the family's configs are checked
by tests/test_entropy_dynamics_study.py without training.

Clip-higher is tested against the four-pass arm, not against `GRPO`: the main job and the
preset take one update per rollout batch, where the ratio is exactly 1 and no clip can bind,
so `rl.epsilon_high` there would change nothing (the same run under another hash).

Measured, from what the RL stage logs per step in metrics.jsonl (no measurement of its own):
`entropy`, the policy's mean token entropy over the loss-masked tokens of the step's sampled
completions (all of them, at the sampling temperature), computed in the update at the
parameters that sampled them (the four-pass arms log the mean over their four passes), and
`pass@1`, the share of the step's completions that are right (training accuracy; on
spell_backward a completion the dataset's scorer gives 1, while the reward pays partial
credit). The reasoning-gym host loop logs both under the same names as arithmetic's device
loop (`rl.batch.rollout_record`'s pass@1 from the task's `is_correct`; the learner's
`entropy`). Per run:

* `entropy_start`: the first step's entropy (the base's, on its own samples);
  `entropy_end`: the mean over the last window of `WINDOW` steps (a third of the steps
  when there are fewer than three windows);
  `entropy_ratio` = end / start (1: nothing spent; the clip-higher and bonus claims'
  metric);
* `entropy_ratio_early` = the mean over the window ending at a third of the steps / start
  (the collapse claim's metric: Cui et al.'s drop "at the early training stage");
  `entropy_drop_early`: the share of the drop (start -> end) already spent by that window,
  and `pass@1_gain_early` the same share of the training pass@1 gain (descriptive);
* the fit of R = -a exp(H) + b over the run's training curve: the steps cut into
  consecutive windows of `WINDOW` steps, each window's mean entropy H and mean training
  pass@1 R, least squares of R on exp(H) with a >= 0 (`fit_entropy_law`): `fit_a`, `fit_b`,
  `fit_r2` (0 when the data rise with the entropy: the relation's direction fails),
  `fit_ceiling` = b - a (R at H = 0, the paper's predicted ceiling) and its gap to the last
  window's training pass@1. The windows: `WINDOW` steps each, fewer (a third of the steps)
  when a run has under three windows; the main job's 80 steps give eight points, the
  preset's 40 give four, enough for the fit (it needs three) but a thin curve (the fit
  claim's can-fail and the README's Limits);
* held-out pass@1 (and the format rate) of the run's final evaluation, and the training
  clip fraction (where the clip acted) and KL to the reference.

Contrasts stay within a family, paired by (base, seed); one Holm family holds both families'
contrasts. Every arithmetic claim has a twin on spell_backward (the same text, margin and
test on the family's arms, its own can-fail): each test reads only what every RL run logs
and its held-out evaluation, so none needs the arithmetic task and none is left untwinned.

Figures, per family: `curves.png` and `curves_spell_backward.png` (entropy, training pass@1
and clip fraction over the steps), `fit.png` and `fit_spell_backward.png` (per arm, each
run's window points and its fitted curve).
"""

from __future__ import annotations

import dataclasses
import math

from grpo_jax.studies import common, families, tables, tiers
from grpo_jax.studies.arms import per_arm, training_means

GRPO, BONUS = "GRPO", "entropy bonus"
PASSES, CLIP_HIGHER = "GRPO, multi-pass", "clip-higher, multi-pass"
KINDS = (GRPO, BONUS, PASSES, CLIP_HIGHER)  # the four arms of each family
NO_CHANGE, NO_FIT = "no change", "no fit"  # pseudo-arms: fixed bars (`common.constant_arm`)
ARITHMETIC, FAMILY = "arithmetic", families.SECOND
FAMILIES = (ARITHMETIC, FAMILY)


def named(family: str, arm: str) -> str:
    """An arm's name on a family: the arm itself on arithmetic (the main job's arms keep their
    plain names), "<family>: <arm>" on the other (`families.arm_name`)."""
    return arm if family == ARITHMETIC else families.arm_name(family, arm)


MAIN_ARMS = KINDS
FAMILY_ARMS = tuple(named(FAMILY, kind) for kind in KINDS)
ARMS = (*MAIN_ARMS, *FAMILY_ARMS)
# updates_per_batch's arm the clip-higher arms share (four clipped passes at lr 1e-3)
PASSES_ARM = "mu=4, lr=1e-3"
EPSILON_HIGH = 0.28  # DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476, sec. 3.1)
# The entropy bonus, fixed before the runs: PPO's own entropy coefficient (Schulman et al.
# 2017, the Atari runs' c2), on a per-token mean loss whose advantages are normalised to unit
# spread per group, so the bonus weighs as much per token as the main job's KL coefficient
# (0.01). Not tuned: Cui et al. report the entropy loss sensitive to its coefficient, which
# one value cannot show (the README's Limits).
ENTROPY_COEF = 0.01
WINDOW = 10  # steps per point of the fitted training curve
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03  # held-out pass@1, as the other studies
COLLAPSE_MARGIN = 0.2  # entropy_ratio: a fifth of the starting entropy spent
KEEP_MARGIN = 0.1  # entropy_ratio: a tenth of the starting entropy kept
R2_BAR = 0.8  # fit_r2: the fit explains at least four-fifths of the curve's variance

# the contrasts of one family, named as on arithmetic
KIND_SPECS = [(GRPO, NO_CHANGE, "entropy_ratio_early"), (CLIP_HIGHER, PASSES, "entropy_ratio"),
              (BONUS, GRPO, "entropy_ratio"), (GRPO, NO_FIT, "fit_r2"),
              (CLIP_HIGHER, PASSES, "pass@1"), (BONUS, GRPO, "pass@1")]


def family_specs(family: str) -> list[tuple[str, str, str]]:
    """`KIND_SPECS` on `family`'s arms: contrasts within the family."""
    return [(named(family, a), named(family, b), metric) for a, b, metric in KIND_SPECS]


SPECS = [spec for family in FAMILIES for spec in family_specs(family)]


def base_config(tier: str):
    """The full tier: the base set of the main base (role "base", the arithmetic arms') and
    spell_backward's base (its arms'); the mini tier: the main base alone (the family's
    arms do not run there)."""
    main = common.main_base(tier)
    return families.with_family(main, tier, FAMILY) if tier == "full" else main


attach = families.attach


def lr_factor(tier: str = "full") -> float:
    """updates_per_batch's `PASSES_ARM` learning rate over the main job's (1e-3 / 2e-4 = 5 at
    the full tier): the factor the family's multi-pass arms scale the preset's by."""
    from grpo_jax.studies import updates_per_batch

    passes = updates_per_batch.arm_config(PASSES_ARM, tier).rl.lr
    return passes / common.main_arm(tier, "eval_base,rl,eval_final").rl.lr


def family_config(kind: str, tier: str = "full", family: str = FAMILY):
    """One arm kind on `family`: the preset's GRPO stage from the family's base role
    (`families.grpo`: eval_base, rl, eval_final), changed as `arm_config` changes the main
    job's for that kind (the multi-pass kinds: the passes and clip of updates_per_batch's
    `PASSES_ARM`, the preset's learning rate times `lr_factor`)."""
    from grpo_jax.studies import updates_per_batch

    config = families.grpo(tier, family)
    if kind in (PASSES, CLIP_HIGHER):
        passes, epsilon, _ = updates_per_batch.ARMS[PASSES_ARM]
        config.rl.num_iterations = passes
        if epsilon is not None:
            config.rl.epsilon = epsilon
        config.rl.lr = float(config.rl.lr) * lr_factor(tier)
        config.rl.fused_steps = 0  # the host loop (the preset's already)
        if kind == CLIP_HIGHER:
            config.rl.epsilon_high = EPSILON_HIGH
    elif kind == BONUS:
        config.rl.entropy_coef = ENTROPY_COEF
    elif kind != GRPO:
        raise ValueError(f"entropy_dynamics: unknown arm {kind!r}; expected one of {KINDS}")
    return config


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from its family's base (model.init_from: "" for the main base, the
    family's role name otherwise, until `attach`): the held-out evaluation, the arm's GRPO
    stage, the evaluation again."""
    from grpo_jax.studies import updates_per_batch

    if arm in FAMILY_ARMS:
        return family_config(KINDS[FAMILY_ARMS.index(arm)], tier)
    if arm in (PASSES, CLIP_HIGHER):
        config = updates_per_batch.arm_config(PASSES_ARM, tier)
        if arm == CLIP_HIGHER:
            config.rl.epsilon_high = EPSILON_HIGH
        return config
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    if arm == BONUS:
        config.rl.entropy_coef = ENTROPY_COEF
    elif arm != GRPO:
        raise ValueError(f"entropy_dynamics: unknown arm {arm!r}; expected one of {ARMS}")
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


# ---- the fit and the curve's figures --------------------------------------------------------

def fit_entropy_law(entropy, reward) -> dict:
    """Least squares of R = -a exp(H) + b with a >= 0 over points (H, R).

    With x = exp(H) the model is linear, R = b - a x: the unconstrained fit is ordinary least
    squares of R on x; when its slope is positive (R rises with H, a < 0) the constrained
    optimum is a = 0, b = mean(R), which explains nothing (R^2 = 0). R^2 = 1 - SS_res / SS_tot
    over the points. Non-finite points are left out; fewer than 3 points, or no spread in x
    or R, give NaN. (The study's points are window means of H, exponentiated: a window's
    mean of exp(H) exceeds exp of its mean H by about exp(H) var(H) / 2 within the window,
    second order in the entropy's change over a window.)

    Returns:
      {"a", "b", "r2", "ceiling" (b - a: R at H = 0), "n"}.
    """
    pairs = [(math.exp(float(h)), float(r)) for h, r in zip(entropy, reward)
             if h is not None and r is not None and math.isfinite(h) and math.isfinite(r)]
    n = len(pairs)
    nan = {"a": math.nan, "b": math.nan, "r2": math.nan, "ceiling": math.nan, "n": n}
    if n < 3:
        return nan
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    if sxx <= 0.0 or syy <= 0.0:
        return nan
    slope = sxy / sxx
    a = max(0.0, -slope)
    b = my + a * mx
    residual = sum((y - (b - a * x)) ** 2 for x, y in pairs)
    return {"a": a, "b": b, "r2": 1.0 - residual / syy, "ceiling": b - a, "n": n}


def _mean(rows, name: str) -> float:
    """The mean of the finite values of `name` over `rows` (NaN without any)."""
    values = [r.get(name) for r in rows]
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(values) / len(values) if values else math.nan


def windows(rows, name: str, window: int = WINDOW) -> list[float]:
    """The means of `name` over consecutive windows of `window` training rows (a last,
    shorter window left out; non-finite values left out of a mean, NaN without any)."""
    return [_mean(rows[start:start + window], name)
            for start in range(0, len(rows) - window + 1, window)]


def early_share(start: float, early: float, end: float) -> float:
    """(early - start) / (end - start): the share of a change from `start` to `end` already
    made at `early` (NaN without a change)."""
    values = (start, early, end)
    if not all(v is not None and math.isfinite(v) for v in values) or end == start:
        return math.nan
    return (early - start) / (end - start)


def curve_values(rows) -> dict:
    """A run's entropy and fit figures (the module's docstring) from its training rows."""
    if not rows:
        return {}
    window = max(1, min(WINDOW, len(rows) // 3))
    entropy, accuracy = curve_points(rows)
    fit = fit_entropy_law(entropy, accuracy)
    start = rows[0].get("entropy")
    start = float(start) if start is not None else math.nan
    end = _mean(rows[-window:], "entropy")
    third = max(1, math.ceil(len(rows) / 3))
    early_rows = rows[max(0, third - window):third]
    early = _mean(early_rows, "entropy")
    pass_start = rows[0].get("pass@1")
    pass_start = float(pass_start) if pass_start is not None else math.nan
    pass_end = _mean(rows[-window:], "pass@1")
    pass_early = _mean(early_rows, "pass@1")
    values = {"entropy_start": start, "entropy_end": end,
              "entropy_ratio": end / start if start and math.isfinite(start) else math.nan,
              "entropy_ratio_early": (early / start if start and math.isfinite(start)
                                      else math.nan),
              "entropy_drop_early": early_share(start, early, end),
              "pass@1_gain_early": early_share(pass_start, pass_early, pass_end),
              "train_pass@1_end": pass_end,
              "fit_a": fit["a"], "fit_b": fit["b"], "fit_r2": fit["r2"],
              "fit_ceiling": fit["ceiling"], "fit_points": fit["n"],
              "ceiling_gap": fit["ceiling"] - pass_end}
    return {k: (v if isinstance(v, int) or math.isfinite(v) else None)
            for k, v in values.items()}


# ---- the analysis ---------------------------------------------------------------------------

def _values(record) -> dict:
    rows = common.training_rows(record)
    return {**common.eval_values(record, METRICS), **curve_values(rows),
            **training_means(record, ("clip_frac", "kl_ref"))}


def curve_points(rows) -> tuple[list[float], list[float]]:
    """The fitted curve's points of a run: (window means of the entropy, of training
    pass@1), the windows as `curve_values` cuts them."""
    window = max(1, min(WINDOW, len(rows) // 3))
    return windows(rows, "entropy", window), windows(rows, "pass@1", window)


def plot_fits(points: dict, out: str, name: str = "fit.png",
              arms: tuple[str, ...] = MAIN_ARMS) -> None:
    """`out/name`: one panel per arm of `arms` with points, each run's window points
    (training pass@1 against the entropy) and its fitted R = -a exp(H) + b."""
    import numpy as np

    plt = common.pyplot()
    arms = [arm for arm in arms if points.get(arm)]
    if not arms:
        return
    fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.4), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        for index, (entropy, accuracy) in enumerate(points[arm]):
            color = f"C{index % 10}"
            ax.plot(entropy, [100.0 * r for r in accuracy], "o", ms=3, color=color)
            fit = fit_entropy_law(entropy, accuracy)
            finite = [h for h in entropy if h is not None and math.isfinite(h)]
            if finite and math.isfinite(fit["r2"]):
                grid = np.linspace(min(finite), max(finite), 50)
                ax.plot(grid, 100.0 * (fit["b"] - fit["a"] * np.exp(grid)), "-", lw=1,
                        color=color)
        ax.set_title(f"{arm}: training pass@1 against entropy", fontsize=9)
        ax.set_xlabel("entropy, nats per token (window means)")
        ax.set_ylabel("training pass@1, %")
    common.save_figure(fig, out, name)


def figure_name(stem: str, family: str) -> str:
    """`stem`.png on arithmetic, `stem`_<family>.png on the other family."""
    return f"{stem}.png" if family == ARITHMETIC else f"{stem}_{family}.png"


def add_pseudo_arms(arms: dict) -> None:
    """Per family, from its `GRPO` runs: its base (their evaluation before training) and the
    fixed bars `no change` (entropy ratios 1) and `no fit` (R² 0)."""
    for family in FAMILIES:
        grpo = named(family, GRPO)
        common.add_base_arm(arms, grpo, METRICS, name=named(family, "base"))
        for metric in ("entropy_ratio", "entropy_ratio_early"):
            common.constant_arm(arms, grpo, named(family, NO_CHANGE), metric, 1.0)
        common.constant_arm(arms, grpo, named(family, NO_FIT), "fit_r2", 0.0)


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    add_pseudo_arms(arms)
    panels = (("entropy", "policy entropy, nats per token (training samples)"),
              ("pass@1", "training pass@1"), ("clip_frac", "clip fraction"))
    family_arms = {family: tuple(named(family, kind) for kind in KINDS) for family in FAMILIES}
    curves = {family: {arm: rows for arm, rows in common.arm_curves(runs, names).items()
                       if rows}
              for family, names in family_arms.items()}
    points = {arm: [curve_points(common.training_rows(r)) for r in runs.arm(arm)
                    if r.finished] for arm in ARMS}

    def plots(out: str) -> None:
        for family, names in family_arms.items():
            if curves[family]:
                common.curve_panels(curves[family], panels, out, figure_name("curves", family))
            plot_fits(points, out, figure_name("fit", family), names)

    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms),
        extra={"fit": {"window_steps": WINDOW, "model": "R = -a exp(H) + b, a >= 0",
                       "R": "training pass@1 (window mean)",
                       "H": "token entropy of the sampled completions (window mean)"},
               "entropy_coef": ENTROPY_COEF, "epsilon_high": EPSILON_HIGH,
               "families": list(FAMILIES),
               "family_multi_pass_lr_factor": lr_factor(runs.tier)},
        protocol={"notes": "entropy and training pass@1 as the RL stage logs them per step; "
                           f"the fit over windows of {WINDOW} steps; contrasts within a "
                           f"family (arithmetic, {FAMILY})"},
        plots=plots, scales={"entropy_ratio": (1.0, 3), "entropy_ratio_early": (1.0, 3),
                             "fit_r2": (1.0, 3)})


def table(arms: dict) -> str:
    order = [named(family, arm) for family in FAMILIES for arm in (*KINDS, "base")]
    return tables.arm_table(
        arms, order,
        ("pass@1", "entropy start", "entropy end", "end / start", "a third / start",
         "drop spent by a third", "gain made by a third", "fit R²", "fit a", "fit b",
         "ceiling b - a", "ceiling - final train pass@1", "clip fraction"),
        tables.metric_row("pass@1", ("entropy_start", 1.0, 3), ("entropy_end", 1.0, 3),
                          ("entropy_ratio", 1.0, 2), ("entropy_ratio_early", 1.0, 2),
                          "entropy_drop_early", "pass@1_gain_early", ("fit_r2", 1.0, 2),
                          ("fit_a", 1.0, 3), ("fit_b", 1.0, 3), "fit_ceiling", "ceiling_gap",
                          ("clip_frac", 100.0, 2)),
        "held-out pass@1 in %; entropy in nats per token of the training samples (start: the "
        "first step, the base's; end: the mean of the last steps; a third: the mean of the "
        "window ending at a third of the steps); the shares, the ceiling "
        "and the clip fraction in %; the fit of training pass@1 R against the entropy H, "
        f"R = -a exp(H) + b with a >= 0, over windows of {WINDOW} steps, per run; mean ± "
        f"95% half-width over (base, seed) runs. Arms named \"{FAMILY}: ...\" run on "
        f"reasoning-gym's {FAMILY} from its base (training pass@1: completions its scorer "
        "gives 1); the others on arithmetic from the main base.", first="arm")


ABSTRACT = ("Cui et al. 2025, \"The Entropy Mechanism of Reinforcement Learning for Reasoning "
            "Language Models\", arXiv:2505.22617, abstract (as on Hugging Face Papers; arXiv's "
            "first version words it slightly differently)")
DAPO = ("Yu et al. 2025, \"DAPO: An Open-Source LLM Reinforcement Learning System at Scale\", "
        "arXiv:2503.14476, sec. 3.1 (close paraphrase)")
PPO = ("Schulman et al. 2017, \"Proximal Policy Optimization Algorithms\", arXiv:1707.06347, "
       "sec. 5, eq. 9")
READING = (" (the study's reading: an intervention that keeps entropy should raise "
           "performance)")
ARITHMETIC_CLAIMS = (
    common.Claim("the policy entropy dropped sharply at the early training stage",
                 ABSTRACT + ", of RL runs \"without entropy intervention\"; tested as the "
                 "entropy of the window ending at a third of the steps over the first step's, "
                 "GRPO against no change",
                 (GRPO, NO_CHANGE, "entropy_ratio_early"), "<", margin=COLLAPSE_MARGIN,
                 can_fail="fails unless GRPO's entropy at a third of the steps (the mean of "
                          "the window ending there) over its first step's lies at least 0.2 "
                          "below 1 (Holm p < 0.05, no base above 1): the main job's KL penalty "
                          "to the base (β in the design block) pulls the policy back towards "
                          "the base's entropy, a reward that also pays the format leaves the "
                          "entropy free to stay or rise, and an entropy that falls late in the "
                          "run, not early, fails it too",
                 note="the main job has a KL penalty to the base (the paper's runs had "
                      "none)"),
    common.Claim("the upper clip can restrict the exploration of the policy; Clip-Higher "
                 "addresses the entropy collapse", DAPO + "; tested as end / start entropy "
                 "at four clipped passes per batch, where the clip binds (the multi-pass "
                 "arms)", (CLIP_HIGHER, PASSES, "entropy_ratio"), ">", margin=KEEP_MARGIN,
                 can_fail="fails unless clip-higher keeps at least a tenth more of the "
                          "starting entropy than the same four passes with the symmetric "
                          "clip: the upper clip binds only on tokens whose ratio passes 1.2 "
                          "with a positive advantage (the table's clip fraction says how "
                          "many tokens the clip acts on), and few such tokens leave nothing "
                          "for clip-higher to change"),
    common.Claim("adding an entropy bonus to ensure sufficient exploration",
                 PPO + " (one of the interventions Cui et al. 2025 discuss); tested as end / "
                 "start entropy against GRPO", (BONUS, GRPO, "entropy_ratio"), ">",
                 margin=KEEP_MARGIN, kind="check",
                 can_fail="a check, not a claim: the loss rewards entropy, so the arm keeps "
                          "more of it by construction; only a bonus too small to move the "
                          "entropy by the margin would fail"),
    common.Claim("we establish a transformation equation R=-a*e^H+b between entropy H and "
                 "downstream performance R", ABSTRACT + "; tested per GRPO run as the R² of "
                 "the fit (a >= 0) of training pass@1 against the entropy over windows of "
                 "steps, against no fit (R² 0), the margin the bar the mean R² must reach",
                 (GRPO, NO_FIT, "fit_r2"), ">", margin=R2_BAR,
                 can_fail="fails unless the mean R² of GRPO's runs reaches 0.8: the fit is "
                          "0 when training pass@1 rises with the entropy, and low when the "
                          "entropy settles while pass@1 keeps rising (or the reverse), or when "
                          "the entropy hardly moves and the windows' noise dominates",
                 note="R is training pass@1 (the paper's is downstream performance); over a "
                      "small entropy range exp(H) is nearly linear in H, so the form is not "
                      "told apart from a line"),
    common.Claim("the policy performance is traded from policy entropy, thus bottlenecked by "
                 "its exhaustion", ABSTRACT + READING + "; the paper's own interventions are "
                 "Clip-Cov and KL-Cov; tested on clip-higher at four passes per batch, "
                 "held-out pass@1", (CLIP_HIGHER, PASSES, "pass@1"), ">",
                 margin=PASS_MARGIN,
                 can_fail=f"fails unless clip-higher's held-out pass@1 lies at least "
                          f"{100 * PASS_MARGIN:.0f} points above the symmetric clip's at the "
                          "same four passes (Holm p < 0.05, no base the other way): the "
                          "entropy it keeps may buy nothing within the run's steps, or cost "
                          "accuracy, as a token kept uncertain can be a wrong digit"),
    common.Claim("the policy performance is traded from policy entropy, thus bottlenecked by "
                 "its exhaustion", ABSTRACT + READING + "; the paper reports the entropy "
                 "loss sensitive to its coefficient; tested on the entropy bonus, held-out "
                 "pass@1", (BONUS, GRPO, "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail=f"fails unless the entropy bonus's held-out pass@1 lies at least "
                          f"{100 * PASS_MARGIN:.0f} points above GRPO's (Holm p < 0.05, no "
                          "base the other way): kept entropy may buy nothing within the run's "
                          "steps, and the bonus spends loss on uncertainty at tokens that "
                          "should be certain (the digits of an answer)"),
)


# Each arithmetic claim's twin on the family: why its test could fail there, and its note.
COVERAGE = ("the base is far from its coverage ceiling (pass@1 0.10, pass@8 0.55 in "
            "docs/reasoning_gym.md's Results)")
WHY = {
    (GRPO, NO_CHANGE, "entropy_ratio_early"):
        "a spell_backward completion is a few letters (the worked reversal and the answer) "
        "between tags that are near-certain from the start, so the mean token entropy has "
        "little to spend beyond the letters; the preset's GRPO stage keeps a KL penalty to "
        "the base (β in the design block) and lasts 40 steps, half the main job's; and "
        f"{COVERAGE}, with a partial-credit reward that keeps reward spread within groups "
        "after the first right spellings, so the entropy may stay while GRPO still explores; "
        "at a third of the preset's 40 steps the window is steps 5-14, so a drop that comes "
        "later in the run does not count",
    (CLIP_HIGHER, PASSES, "entropy_ratio"):
        "the upper clip binds only on tokens whose ratio passes 1.2 with a positive "
        "advantage (the table's clip fraction says on how many); the partial-credit reward "
        "gives many tokens a positive advantage, but each letter is fixed by the word once "
        "it is read, so once the four passes have learnt the reversal both multi-pass arms' "
        "entropy may fall near zero and leave less than a tenth of the start for "
        "clip-higher to keep",
    (GRPO, NO_FIT, "fit_r2"):
        "at the preset's 40 steps the windows of 10 steps give four points per run (eight "
        "on arithmetic), enough for the fit (it needs three) but one noisy window can sink "
        "the R², and four points of a monotone curve reach the bar more easily than eight; "
        f"{COVERAGE}, so training pass@1 can climb within the first window while the "
        "entropy keeps falling after it (or the reverse), leaving no function of H; and "
        "pass@1 counts only the completions the scorer gives 1, while the updates follow "
        "the partial credit, so R can lag the entropy",
    (CLIP_HIGHER, PASSES, "pass@1"):
        f"{COVERAGE}: the right spelling is among a base's eight samples for about half the "
        "problems, so both four-pass arms may climb alike within the preset's 40 steps "
        "whatever entropy they keep; and kept entropy can cost pass@1 here, as a completion "
        "counts for pass@1 only when every letter is right, where the reward pays partial "
        "credit",
    (BONUS, GRPO, "pass@1"):
        f"{COVERAGE}: GRPO may not be bottlenecked by exploration within the preset's 40 "
        "steps, so kept entropy may buy nothing; and the bonus spends loss on uncertainty at "
        "letters the word fixes, where one wrong letter of a few loses the completion for "
        "pass@1 (the partial-credit reward still pays it)",
}
CHECK_WHY = ("a check, not a claim: the loss rewards entropy, so the arm keeps more of it by "
             "construction; only a bonus too small to move the entropy by the margin would "
             "fail, and on spell_backward the policy gradient it must hold against is strong: "
             f"{COVERAGE}, and the partial-credit reward pays every letter in place")
NOTES = {
    (GRPO, NO_CHANGE, "entropy_ratio_early"):
        "the preset's GRPO stage has a KL penalty to the base, as the main job's (the "
        "paper's runs had none)",
    (GRPO, NO_FIT, "fit_r2"):
        "R is training pass@1 (the paper's is downstream performance); over a small entropy "
        "range exp(H) is nearly linear in H, so the form is not told apart from a line; four "
        "window points a run at the preset's 40 steps",
}


def twin(claim: common.Claim, family: str = FAMILY) -> common.Claim:
    """`claim` quoted as the arithmetic study quotes it (text, margin, direction), tested on
    `family`'s arms, with its own can-fail (the rule's, then why on the family) and note."""
    key = claim.test
    a, b, metric = key
    check = claim.kind == "check"
    return dataclasses.replace(
        claim, test=(named(family, a), named(family, b), metric),
        source=f"{claim.source}; rerun on reasoning-gym's {family}",
        can_fail=CHECK_WHY if check else "", why="" if check else WHY[key],
        note=NOTES.get(key, claim.note))


FAMILY_CLAIMS = tuple(twin(claim) for claim in ARITHMETIC_CLAIMS)
CLAIMS = (*ARITHMETIC_CLAIMS, *FAMILY_CLAIMS)

STUDY = common.Study(
    name="entropy_dynamics",
    question="does the policy's entropy collapse under GRPO, do clip-higher (at four clipped "
             "passes, where the clip binds) and an entropy bonus keep it, do they raise "
             "held-out pass@1, and does training pass@1 follow R = -a exp(H) + b, on "
             "arithmetic and on reasoning-gym's spell_backward, paired by seed within each "
             "family?",
    tiers=tiers.standard(
        full="about 4 hours on 2 cores (3.8-4.2 h, estimated, not yet run), at 4 bases x 2 seeds: "
             "arithmetic, 16 runs of the main job's GRPO stage at about 2 min (forking_tokens' "
             "2041 s for 18 runs with their measurement) and 16 of four passes per batch at "
             "about 8 min (updates_per_batch's mu = 4), about 2.7 h; spell_backward, 16 runs "
             "of the preset's 40-step GRPO stage at about 1-1.5 min (docs/reasoning_gym.md) "
             "and 16 of four passes at about 3-4 min (one pass's time times arithmetic's "
             "ratio of four passes to one on the host loop, 8 min over 3), about 1.1-1.5 h; "
             "the GRPO arms' runs are forking_tokens' `all` and "
             "replication's `spell_backward: all`, the arithmetic four-pass control's "
             "updates_per_batch's `mu=4, lr=1e-3`, so about 2.5 h beyond those studies' runs; "
             "plus the shared bases when not built yet: the main bases and spell_backward's "
             "(the preset's 800 pretraining steps, measured at 158-938 s in "
             "docs/reasoning_gym.md; shared with replication and the other studies on the "
             "family)",
        mini="about 1 min on 2 cores (measured: 65 s under a load of about 8, the toy "
             "base built in; one seed, 4 toy runs of the arithmetic arms, the family's "
             "arms left to the full tier)",
        mini_arms=MAIN_ARMS, full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
