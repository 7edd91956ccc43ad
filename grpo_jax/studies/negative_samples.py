"""Positive and negative sample reinforcement: GRPO on the completions above their group's
baseline only, below it only, or both (Zhu et al. 2025, arXiv:2506.01347).

Three arms of one GRPO stage from the main base that differ only in `rl.advantage_sign`
(`grpo_jax.rl.update.advantage_sign_tokens`: the policy-gradient term counts on the tokens
whose advantage has the arm's sign; the KL term and the loss's counts are unchanged):

* `both`: every token (pass_at_k's run: one config, so one run directory when the studies
  share a workdir): the main job's RL stage alone (`jobs.rl_alone`: GRPO on accuracy + 0.2 x
  format, groups of 8), shortened to 60 steps of 16 prompts;
* `positive`: the tokens of completions with a positive group-relative advantage (PSR);
* `negative`: those with a negative one (NSR).

After the runs, `measure` samples (pass_at_k's measurement, `measure.measure_samplings`,
into the same file, so a run both studies share is measured once), for each (base, seed),
the base model and each arm's final policy on the same held-out problems (fixed across
seeds) with the same key (a function of the seed): 256 completions per problem at
temperature 1. The analysis computes each policy's pass@k (the unbiased estimator) for
k = 1, 2, ..., 256, the share of problems it never solves and those it solves and the base
model's draw never does, and, from the training logs, the policy's token entropy on its own
samples over the last steps (`measure.window_mean`; the base model's: the first step's,
made by the base's parameters on the base's samples, shared by the three arms of a (base,
seed)) and the share of tokens that carried the policy gradient.
"""

from __future__ import annotations

from grpo_jax import storage
from grpo_jax.stats import interval
from grpo_jax.studies import common, pass_at_k, tables, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.pass_at_k import FILE, KS, base_config  # pass_at_k's base and file

BOTH, POSITIVE, NEGATIVE, BASE_MODEL = "both", "positive", "negative", "base model"
SIGNS = {BOTH: "both", POSITIVE: "positive", NEGATIVE: "negative"}  # rl.advantage_sign
ARMS = tuple(SIGNS)
LARGE_K = KS[-1]  # the largest k: every sample of a problem
MID_K = 16
PASS_MARGIN = 0.02  # pass@1 and pass@16: a few held-out problems
LARGE_MARGIN = 0.01  # pass@256: about one held-out problem
ENTROPY_MARGIN = 0.01  # nats per token
WINDOW = 10  # the last training steps whose entropy is the policy's (measure.window_mean)

SPECS = [(NEGATIVE, BASE_MODEL, "pass@1"), (NEGATIVE, BASE_MODEL, f"pass@{MID_K}"),
         (NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"), (NEGATIVE, BOTH, "pass@1"),
         (NEGATIVE, BOTH, f"pass@{MID_K}"), (POSITIVE, BASE_MODEL, "pass@1"),
         (POSITIVE, BASE_MODEL, f"pass@{LARGE_K}"), (POSITIVE, BASE_MODEL, "entropy")]


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: pass_at_k's RL run (the main job's RL stage alone from the base in
    model.init_from) with the arm's `rl.advantage_sign` ("both" is the field's default, so
    that arm is pass_at_k's run itself)."""
    config = pass_at_k.arm_config(tier)
    if SIGNS[arm] != "both":
        config.rl.advantage_sign = SIGNS[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def measure(runs: common.StudyRuns) -> None:
    """pass_at_k's measurement (`pass_at_k.FILE`) of every finished run without one, and the
    base model's draw with each seed's key."""
    measure_lib.measure_samplings(runs, pass_at_k.measurement_sizes(runs.tier), FILE)


# ---- the analysis -----------------------------------------------------------------------------

def training_figures(rows: list[dict], window: int = WINDOW) -> dict:
    """From a run's training rows: `entropy`, the policy's token entropy on its own samples
    over the last `window` steps (`measure.window_mean`), `first_entropy` (the first step's:
    the starting parameters'), and `sign_frac`, the mean share of the loss mask's tokens
    that carried the policy gradient (None where the arm logs none: every token)."""
    values = [r["sign_frac"] for r in rows if r.get("sign_frac") is not None]
    return {"entropy": measure_lib.window_mean(rows, "entropy", first=False, window=window),
            "first_entropy": rows[0].get("entropy") if rows else None,
            "sign_frac": sum(values) / len(values) if values else None}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    sizes = pass_at_k.measurement_sizes(runs.tier)
    ks = sizes["ks"]
    rows = common.ArmRows()
    base_done: set = set()
    for arm in ARMS:  # `both` first: the base model's entropy from its runs when they exist
        for record in runs.arm(arm):
            if not record.finished:
                continue
            mine = measure_lib.load_problems(storage.join(record.workdir, FILE))
            base = measure_lib.base_problems(runs, record.base, record.seed)
            if mine is None or base is None:
                continue
            trained = training_figures(common.training_rows(record))
            figures = measure_lib.pass_figures(mine, ks, base, pass_at_k.STRATA)
            rows.add(arm, record.base, record.seed, {**figures, **trained})
            if (record.base, record.seed) not in base_done:
                base_done.add((record.base, record.seed))
                base_figures = measure_lib.pass_figures(base, ks, None, pass_at_k.STRATA)
                rows.add(BASE_MODEL, record.base, record.seed,
                         {**base_figures, "entropy": trained["first_entropy"]})
    arms = rows.arms((BASE_MODEL, *ARMS))
    panels = (("reward_mean", "training reward"),
              ("entropy", "policy entropy (training tokens, nats)"),
              ("sign_frac", "share of tokens carrying the policy gradient"))
    curves = common.arm_curves(runs, ARMS)

    def plots(out: str) -> None:
        plot(arms, ks, out)
        common.curve_panels(curves, panels, out)

    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, ks),
        extra={"sampling_key": measure_lib.KEY, "entropy_window": WINDOW},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training (pass_at_k's measurement): each "
                            f"(base, seed) samples the base model and each arm's policy "
                            f"with one key ({measure_lib.KEY} folded with the seed), "
                            f"{sizes['samples']} completions per problem at temperature 1; "
                            f"entropy: the training logs' token entropy, the last {WINDOW} "
                            "steps (the base model: the first step)")},
        plots=plots)


ROWS = (("problems never solved (%)", "never_solved_rate", 100.0, 1),
        ("solved, never by the base model's draw (%)", "only_this_solves_rate", 100.0, 1),
        ("format rate (%)", "format_rate", 100.0, 1),
        ("mean length (tokens)", "mean_length", 1.0, 1),
        ("token entropy (nats; base model: first step)", "entropy", 1.0, 3),
        ("tokens carrying the policy gradient (%)", "sign_frac", 100.0, 1))


def table(arms: dict, ks) -> str:
    """pass@k of every policy at each k, then the coverage, format, length, entropy and
    gradient-share rows."""
    names = [n for n in (BASE_MODEL, *ARMS) if n in arms]
    if not names:
        return ""
    lines = ["| k | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in ks:
        cells = [tables.optional_cell(arms[n]["metrics"].get(f"pass@{k}", [])) for n in names]
        lines.append(f"| pass@{k} (%) | " + " | ".join(cells) + " |")
    for label, metric, scale, digits in ROWS:
        cells = [tables.optional_cell(arms[n]["metrics"].get(metric, []), scale, digits)
                 for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", (f"Mean ± 95% half-width over (base, seed). pass@k and coverage at "
                   f"{ks[-1]} samples per held-out problem; the arms' entropy is the mean of "
                   f"the last {WINDOW} training steps (the base model's: the first step, "
                   "before any update); the gradient share is the training mean of the share "
                   "of tokens whose advantage has the arm's sign (not logged by `both`).")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, ks, out: str) -> None:
    """negative_samples.png: pass@k of each policy against k, and each arm's paired difference
    from the base model with its 95% interval over (base, seed)."""
    import numpy as np

    from grpo_jax.studies.arms import paired

    if BASE_MODEL not in arms:
        return
    plt = common.pyplot()
    x = np.asarray(ks)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colors = {BASE_MODEL: "C0", BOTH: "C3", POSITIVE: "C1", NEGATIVE: "C2"}
    for name in arms:
        stats = [interval([v for v in arms[name]["metrics"].get(f"pass@{k}", [])
                           if v is not None]) for k in ks]
        axes[0].plot(x, np.array([s["mean"] for s in stats]) * 100, marker="o", ms=3,
                     color=colors[name], label=name)
    axes[0].set_ylabel("held-out pass@k (%)")
    for name in ARMS:
        if name not in arms:
            continue
        stats = [paired(arms, name, BASE_MODEL, f"pass@{k}") for k in ks]
        common.interval_line(axes[1], x, stats, color=colors[name], label=name)
    axes[1].axhline(0.0, color="gray", lw=0.8)
    axes[1].set_ylabel("arm - base model, same (base, seed) (points)")
    for ax in axes:
        common.k_axis(ax, ks)
        ax.legend(fontsize=7)
    common.save_figure(fig, out, "negative_samples.png")


SOURCE = ("Zhu et al. 2025, \"The Surprising Effectiveness of Negative Reinforcement in LLM "
          "Reasoning\", arXiv:2506.01347, abstract")
NSR = ("training with only negative samples -- without reinforcing correct responses -- can "
       "be highly effective: it consistently improves performance over the base model across "
       "the entire Pass@k spectrum (k up to 256)")
MATCHING = "often matching or surpassing PPO and GRPO"
SIGN_NOTE = ("here an arm keeps the tokens whose group-relative advantage (of accuracy + 0.2 x "
             "format) has its sign, not the paper's +1 / -1 rewards of correct and incorrect "
             "samples")
CEILING = ("the base model solves nearly every problem at the largest k here (about 98% in "
           "pass_at_k): the headroom test says whether an arm can rise by the margin")

CLAIMS = (
    common.Claim(text=NSR, source=SOURCE + " (quoted); tested at k = 1",
                 test=(NEGATIVE, BASE_MODEL, "pass@1"), expect=">", margin=PASS_MARGIN,
                 note=SIGN_NOTE),
    common.Claim(text=NSR, source=SOURCE + f" (quoted); tested at k = {MID_K}",
                 test=(NEGATIVE, BASE_MODEL, f"pass@{MID_K}"), expect=">",
                 margin=PASS_MARGIN, headroom=(BASE_MODEL, f"pass@{MID_K}", 1.0)),
    common.Claim(text=NSR, source=SOURCE + f" (quoted); tested at k = {LARGE_K}",
                 test=(NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"), expect=">",
                 margin=LARGE_MARGIN, headroom=(BASE_MODEL, f"pass@{LARGE_K}", 1.0),
                 note=CEILING),
    common.Claim(text=MATCHING, source=SOURCE + " (quoted, of negative-only training); "
                 "tested against GRPO on both signs (no PPO arm) at k = 1: not below it by "
                 "the margin", test=(NEGATIVE, BOTH, "pass@1"), expect=">=",
                 margin=PASS_MARGIN),
    common.Claim(text=MATCHING, source=SOURCE + " (quoted, of negative-only training); "
                 f"tested against GRPO on both signs (no PPO arm) at k = {MID_K}: not below "
                 "it by the margin", test=(NEGATIVE, BOTH, f"pass@{MID_K}"), expect=">=",
                 margin=PASS_MARGIN),
    common.Claim(text="reinforcing only correct responses improves Pass@1",
                 source=SOURCE + " (quoted)", test=(POSITIVE, BASE_MODEL, "pass@1"),
                 expect=">", margin=PASS_MARGIN, note=SIGN_NOTE),
    common.Claim(text="but degrades performance at higher k",
                 source=SOURCE + f" (quoted, of positive-only training); tested at k = "
                 f"{LARGE_K}, below the base model", test=(POSITIVE, BASE_MODEL,
                                                           f"pass@{LARGE_K}"),
                 expect="<", margin=LARGE_MARGIN),
    common.Claim(text="due to reduced diversity",
                 source=SOURCE + " (quoted, of positive-only training); tested as the "
                 "policy's token entropy on its own samples over the last training steps, "
                 "below the base model's (the first step's)",
                 test=(POSITIVE, BASE_MODEL, "entropy"), expect="<", margin=ENTROPY_MARGIN,
                 note="the token entropy of the training samples is one measure of "
                      "diversity; the answers' diversity is not measured"),
)


STUDY = common.Study(
    name="negative_samples",
    question="GRPO on the completions above their group's baseline only (positive), below it "
             "only (negative), or both: held-out pass@1 and pass@k up to k = 256 against the "
             "base model, paired by (base, seed)",
    tiers=tiers.standard(
        full="about 40-50 min on 2 cores (estimated from sharpening's measured "
             "figures: 18 RL runs of 60 steps at about 80 s each, the 6 of `both` "
             "pass_at_k's, shared in one workdir; 24 samplings of 128 x 256 "
             "completions at 35-57 s each; plus the shared main bases when not built "
             "yet)",
        mini="about 1 min on 2 cores (measured: 72 s alone and 48 s in the suite's "
             "shared workdir, under a load of about 6, the toy base built in; one "
             "seed, 3 toy RL runs, 4 samplings of 4 x 256)"),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
