"""Positive and negative sample reinforcement: GRPO on the completions above their group's
baseline only, below it only, or both (Zhu et al. 2025, arXiv:2506.01347), on arithmetic and
on reasoning-gym's `spell_backward` (`families.SECOND`).

The paper's question is about RL for reasoning in general, so its arms run on two task
families, each from its own base, and every contrast stays within a family:

* arithmetic: three arms of one GRPO stage from the main base that differ only in
  `rl.advantage_sign` (`grpo_jax.rl.update.advantage_sign_tokens`: the policy-gradient term
  counts on the tokens whose advantage has the arm's sign; the KL term and the loss's counts
  are unchanged):

  - `both`: every token (pass_at_k's run: one config, so one run directory when the studies
    share a workdir): the main job's RL stage alone (`jobs.rl_alone`: GRPO on accuracy +
    0.2 x format, groups of 8), shortened to 60 steps of 16 prompts;
  - `positive`: the tokens of completions with a positive group-relative advantage (PSR);
  - `negative`: those with a negative one (NSR);

* `spell_backward` (a word of 3-5 letters spelled backward; the dataset's scorer gives
  partial credit, the share of letters in place, and a completion counts as solved when it
  gives 1): the same three arms, named "spell_backward: <arm>", of the family's GRPO stage
  (`families.grpo`: the preset's 40 steps of 32 prompts x 8, accuracy + 0.2 x format,
  eval_base -> rl -> eval_final) from the family's base (the preset's pretraining, role
  "spell_backward:base" of each base seed's set, `families.with_family`; `attach` wires it).
  `spell_backward: both` is replication's `spell_backward: all` run (one config).

The family's base is far from its coverage ceiling (pass@1 0.10, pass@8 0.55 in
docs/reasoning_gym.md), where the arithmetic base solves nearly every held-out problem at
k = 256 (pass_at_k): the large-k end of the spectrum, where the paper's PSR and NSR part,
has room to move on the family.

The mini tier stays arithmetic-only (its base set is the main base alone, its arms the three
arithmetic ones); the family's configs, wiring, measurement views and analysis are checked
without training in tests/test_negative_samples_study.py.

After the runs, `measure` samples (pass_at_k's measurement, `measure.measure_samplings`, into
pass_at_k's file, so a run both studies share is measured once), for each (base, seed) and
family, the family's base model and each of its arms' final policies on the family's
held-out problems (fixed across seeds; the family base's task, eval seed and eval_final
token limit) with the same key (a function of the seed): 256 completions per problem at
temperature 1. Each family is measured through its own view of the runs (`view`): the base
set's role of that family as the base, that family's arms, and its own folder for the base
model's draws (the arithmetic one: `<study>/base_model/`; the family's:
`<study>/spell_backward/base_model/`), since `measure_samplings` samples a base set's first
role and keys the base model's draw by the set's key alone. The analysis computes each
policy's pass@k (the unbiased estimator) for k = 1, 2, ..., 256, the share of problems it
never solves and those it solves and its family's base-model draw never does, and, from the
training logs, the policy's token entropy on its own samples over the last steps
(`measure.window_mean`; the base model's: the first step's, made by the base's parameters
on the base's samples, shared by the three arms of a (base, seed)) and the share of tokens
that carried the policy gradient.

Claims: each arithmetic claim has a twin on `spell_backward`, quoted as the original (same
text and margin, its source with "; rerun on reasoning-gym's spell_backward"), its test the
same contrast between the family's arms, its can-fail statement the family's own. Every
claim's metric exists on the family (pass@k from the scorer's solved completions, token
entropy from the training logs), so none is left untwinned. The Holm family is the
arithmetic contrasts and their twins.
"""

from __future__ import annotations

import dataclasses

from grpo_jax import storage
from grpo_jax.stats import interval
from grpo_jax.studies import common, families, pass_at_k, tables, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.pass_at_k import FILE, KS  # pass_at_k's file and k

BOTH, POSITIVE, NEGATIVE, BASE_MODEL = "both", "positive", "negative", "base model"
SIGNS = {BOTH: "both", POSITIVE: "positive", NEGATIVE: "negative"}  # rl.advantage_sign
ARMS = tuple(SIGNS)  # the arithmetic arms
FAMILY = families.SECOND  # the reasoning-gym family beside arithmetic
GROUPS = (None, FAMILY)  # the task families, None: arithmetic (its arms' plain names)
LARGE_K = KS[-1]  # the largest k: every sample of a problem
MID_K = 16
PASS_MARGIN = 0.02  # pass@1 and pass@16: a few held-out problems
LARGE_MARGIN = 0.01  # pass@256: about one held-out problem
ENTROPY_MARGIN = 0.01  # nats per token
WINDOW = 10  # the last training steps whose entropy is the policy's (measure.window_mean)


def named(family: str | None, arm: str) -> str:
    """An arm (or the base model) of a family: the plain name on arithmetic,
    "<family>: <arm>" on a reasoning-gym family."""
    return arm if family is None else families.arm_name(family, arm)


FAMILY_ARMS = tuple(named(FAMILY, arm) for arm in ARMS)
ALL_ARMS = ARMS + FAMILY_ARMS

MAIN_SPECS = [(NEGATIVE, BASE_MODEL, "pass@1"), (NEGATIVE, BASE_MODEL, f"pass@{MID_K}"),
              (NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"), (NEGATIVE, BOTH, "pass@1"),
              (NEGATIVE, BOTH, f"pass@{MID_K}"), (POSITIVE, BASE_MODEL, "pass@1"),
              (POSITIVE, BASE_MODEL, f"pass@{LARGE_K}"), (POSITIVE, BASE_MODEL, "entropy")]
# The Holm family: the arithmetic contrasts, then their twins within the family.
SPECS = MAIN_SPECS + [(named(FAMILY, a), named(FAMILY, b), metric)
                      for a, b, metric in MAIN_SPECS]


# ---- configs ----------------------------------------------------------------------------------

def base_config(tier: str):
    """pass_at_k's base (the main job's pretraining) at the mini tier; at the full tier the
    base set of it (role "base") and the family's base (`families.with_family`)."""
    main = pass_at_k.base_config(tier)
    return families.with_family(main, tier, FAMILY) if tier == "full" else main


def arm_config(arm: str, tier: str = "full"):
    """One arithmetic arm's run: pass_at_k's RL run (the main job's RL stage alone from the
    base in model.init_from) with the arm's `rl.advantage_sign` ("both" is the field's
    default, so that arm is pass_at_k's run itself)."""
    config = pass_at_k.arm_config(tier)
    if SIGNS[arm] != "both":
        config.rl.advantage_sign = SIGNS[arm]
    return config


def family_arm_config(arm: str, tier: str = "full", family: str = FAMILY):
    """One family arm's run: the family's GRPO stage from its base role (`families.grpo`;
    "both": replication's `all` run of the family) with the arm's `rl.advantage_sign`."""
    config = families.grpo(tier, family)
    if SIGNS[arm] != "both":
        config.rl.advantage_sign = SIGNS[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {**{arm: arm_config(arm, tier) for arm in ARMS},
            **{named(FAMILY, arm): family_arm_config(arm, tier) for arm in ARMS}}


# ---- the measurement --------------------------------------------------------------------------

def view(runs: common.StudyRuns, family: str | None) -> common.StudyRuns:
    """One family's runs as `measure_samplings` and the analysis take them: each base set's
    role of that family as the base ("workdir"; a set without the role left out), the
    family's arms only, and the family's own folder for the base model's draws (arithmetic:
    the study's; a family: `<study>/<family>`)."""
    role = families.MAIN_ROLE if family is None else families.role(family)
    arms = {named(family, arm) for arm in ARMS}
    bases = {}
    for key, base in runs.bases.items():
        roles = base.get("roles") or {families.MAIN_ROLE: base["workdir"]}
        if role in roles:
            bases[key] = {**base, "workdir": roles[role]}
    return dataclasses.replace(
        runs, root=runs.root if family is None else storage.join(runs.root, family),
        runs=[r for r in runs.runs if r.arm in arms and r.base in bases], bases=bases)


def measure(runs: common.StudyRuns) -> None:
    """pass_at_k's measurement (`pass_at_k.FILE`) of every finished run without one, and the
    base model's draw with each seed's key, family by family: `measure.measure_samplings` of
    the family's view (`view`: the family's base, task, held-out problems and token limit,
    and its own folder for the base model's draws)."""
    sizes = pass_at_k.measurement_sizes(runs.tier)
    for family in GROUPS:
        mine = view(runs, family)
        if mine.runs:
            measure_lib.measure_samplings(mine, sizes, FILE)


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


def add_family_rows(rows: common.ArmRows, runs: common.StudyRuns, family: str | None,
                    ks) -> None:
    """The family's arms and its base model (from its view's draws), one row per measured
    (base, seed); pass@k per difficulty on arithmetic (pass_at_k's strata)."""
    mine_runs = view(runs, family)
    strata = pass_at_k.STRATA if family is None else {}
    base_done: set = set()
    for arm in ARMS:  # `both` first: the base model's entropy from its runs when they exist
        for record in mine_runs.arm(named(family, arm)):
            if not record.finished:
                continue
            mine = measure_lib.load_problems(storage.join(record.workdir, FILE))
            base = measure_lib.base_problems(mine_runs, record.base, record.seed)
            if mine is None or base is None:
                continue
            trained = training_figures(common.training_rows(record))
            figures = measure_lib.pass_figures(mine, ks, base, strata)
            rows.add(named(family, arm), record.base, record.seed, {**figures, **trained})
            if (record.base, record.seed) not in base_done:
                base_done.add((record.base, record.seed))
                base_figures = measure_lib.pass_figures(base, ks, None, strata)
                rows.add(named(family, BASE_MODEL), record.base, record.seed,
                         {**base_figures, "entropy": trained["first_entropy"]})


PANELS = (("reward_mean", "training reward"),
          ("entropy", "policy entropy (training tokens, nats)"),
          ("sign_frac", "share of tokens carrying the policy gradient"))


def analyze(runs: common.StudyRuns) -> common.Analysis:
    sizes = pass_at_k.measurement_sizes(runs.tier)
    ks = sizes["ks"]
    rows = common.ArmRows()
    for family in GROUPS:
        add_family_rows(rows, runs, family, ks)
    arms = rows.arms([named(f, n) for f in GROUPS for n in (BASE_MODEL, *ARMS)])
    curves = {f: common.arm_curves(runs, [named(f, arm) for arm in ARMS]) for f in GROUPS}

    def plots(out: str) -> None:
        plot(arms, ks, out)
        for family, series in curves.items():
            if family is None or any(series.values()):
                common.curve_panels(series, PANELS, out, curve_file(family))

    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, ks),
        extra={"sampling_key": measure_lib.KEY, "entropy_window": WINDOW},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training (pass_at_k's measurement): each "
                            f"(base, seed) samples the base model and each arm's policy "
                            f"with one key ({measure_lib.KEY} folded with the seed), "
                            f"{sizes['samples']} completions per problem at temperature 1, "
                            f"per family on its own held-out problems and token limit "
                            f"(arithmetic; {FAMILY}: from the family's base, a completion "
                            "solved when the scorer gives 1); entropy: the training logs' "
                            f"token entropy, the last {WINDOW} steps (the base model: the "
                            "first step)")},
        plots=plots)


def curve_file(family: str | None) -> str:
    return "curves.png" if family is None else f"curves_{family}.png"


ROWS = (("problems never solved (%)", "never_solved_rate", 100.0, 1),
        ("solved, never by the base model's draw (%)", "only_this_solves_rate", 100.0, 1),
        ("format rate (%)", "format_rate", 100.0, 1),
        ("mean length (tokens)", "mean_length", 1.0, 1),
        ("token entropy (nats; base model: first step)", "entropy", 1.0, 3),
        ("tokens carrying the policy gradient (%)", "sign_frac", 100.0, 1))


def table(arms: dict, ks) -> str:
    """Per family: pass@k of every policy at each k, then the coverage, format, length,
    entropy and gradient-share rows."""
    lines = []
    for family in GROUPS:
        names = [n for n in (BASE_MODEL, *ARMS) if named(family, n) in arms]
        if not names:
            continue
        metrics = {n: arms[named(family, n)]["metrics"] for n in names}
        if lines:
            lines.append("")
        lines += [f"**{family or 'arithmetic'}**", "",
                  "| k | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for k in ks:
            cells = [tables.optional_cell(metrics[n].get(f"pass@{k}", [])) for n in names]
            lines.append(f"| pass@{k} (%) | " + " | ".join(cells) + " |")
        for label, metric, scale, digits in ROWS:
            cells = [tables.optional_cell(metrics[n].get(metric, []), scale, digits)
                     for n in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    lines += ["", (f"Mean ± 95% half-width over (base, seed), each family on its own held-out "
                   f"problems from its own base. pass@k and coverage at {ks[-1]} samples per "
                   f"held-out problem; the arms' entropy is the mean of the last {WINDOW} "
                   "training steps (the base model's: the first step, before any update); "
                   "the gradient share is the training mean of the share of tokens whose "
                   "advantage has the arm's sign (not logged by `both`).")]
    return "\n".join(lines) + "\n"


COLORS = {BASE_MODEL: "C0", BOTH: "C3", POSITIVE: "C1", NEGATIVE: "C2"}


def plot(arms: dict, ks, out: str) -> None:
    """negative_samples.png, a row per family with a base model: pass@k of each policy
    against k, and each arm's paired difference from its family's base model with its 95%
    interval over (base, seed)."""
    import numpy as np

    from grpo_jax.studies.arms import paired

    shown = [f for f in GROUPS if named(f, BASE_MODEL) in arms]
    if not shown:
        return
    plt = common.pyplot()
    x = np.asarray(ks)
    fig, axes = plt.subplots(len(shown), 2, figsize=(11, 3.8 * len(shown)), squeeze=False)
    for row, family in zip(axes, shown):
        label = family or "arithmetic"
        base = named(family, BASE_MODEL)
        for name in (BASE_MODEL, *ARMS):
            if named(family, name) not in arms:
                continue
            metrics = arms[named(family, name)]["metrics"]
            stats = [interval([v for v in metrics.get(f"pass@{k}", []) if v is not None])
                     for k in ks]
            row[0].plot(x, np.array([s["mean"] for s in stats]) * 100, marker="o", ms=3,
                        color=COLORS[name], label=name)
        row[0].set_ylabel(f"{label}: held-out pass@k (%)")
        for name in ARMS:
            if named(family, name) not in arms:
                continue
            stats = [paired(arms, named(family, name), base, f"pass@{k}") for k in ks]
            common.interval_line(row[1], x, stats, color=COLORS[name], label=name)
        row[1].axhline(0.0, color="gray", lw=0.8)
        row[1].set_ylabel(f"{label}: arm - base model,\nsame (base, seed) (points)")
        for ax in row:
            common.k_axis(ax, ks)
            ax.legend(fontsize=7)
    common.save_figure(fig, out, "negative_samples.png")


# ---- claims -----------------------------------------------------------------------------------

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

# Why each arithmetic claim's test could fail here, by its test (the rule's own statement
# follows it in `can_fail`).
WHY = {
    (NEGATIVE, BASE_MODEL, "pass@1"): (
        "negative-only updates only push probability off the sampled wrong completions; where "
        "that mass goes is up to the model, and it may go to other wrong answers (the base's "
        "operator confusions), leaving pass@1 flat; and a formatted wrong answer above its "
        "group's mean is a positive sample the negative arm never touches"),
    (NEGATIVE, BASE_MODEL, f"pass@{MID_K}"): (
        f"not testable here when the base's pass@{MID_K} lies within the margin of 1 (the "
        "headroom, from the base model's draw); otherwise mass pushed off the wrong "
        f"completions may only move among other wrong answers, so that no more problems get a "
        f"correct one among {MID_K} samples"),
    (NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"): (
        f"the base solves nearly every problem at k = {LARGE_K} (pass_at_k), so the headroom "
        "(from the base model's draw) may leave less than the margin: then not testable here; "
        "otherwise the short stage of negative-only updates may not reach the few problems "
        "the base never solves"),
    (NEGATIVE, BOTH, "pass@1"): (
        "GRPO on both signs may gain far more at k = 1 than the negative arm: the positive term "
        "is what sharpens a correct answer the base samples rarely, and the negative arm, "
        "without it, may fall below `both` by more than the margin"),
    (NEGATIVE, BOTH, f"pass@{MID_K}"): (
        f"at k = {MID_K} the sharpened `both` may still lead the negative arm by more than the "
        "margin, where the base's own coverage does not close the gap"),
    (POSITIVE, BASE_MODEL, "pass@1"): (
        "positive-only updates are zero on every group whose completions all score alike (all "
        "wrong on a problem the base rarely solves), so the arm may learn little there; and a "
        "formatted wrong answer above its group's mean is reinforced too"),
    (POSITIVE, BASE_MODEL, f"pass@{LARGE_K}"): (
        f"the base solves nearly every problem at k = {LARGE_K}, and a short stage may sharpen "
        f"too little to lose a problem from every one of {LARGE_K} samples: the interval may "
        "sit inside the margin"),
    (POSITIVE, BASE_MODEL, "entropy"): (
        "the positive arm's gradient covers a share of the tokens (`sign_frac`), the stage is "
        "short and the KL penalty pulls towards the base: its entropy may stay within the "
        "margin of the base's"),
}


def _claim(**fields) -> common.Claim:
    """An arithmetic claim whose can_fail is why its test could fail here (`WHY`), then the
    rule's own statement."""
    return common.Claim(**fields, why=WHY[fields["test"]])


CLAIMS_MAIN = (
    _claim(text=NSR, source=SOURCE + " (quoted); tested at k = 1",
           test=(NEGATIVE, BASE_MODEL, "pass@1"), expect=">", margin=PASS_MARGIN,
           note=SIGN_NOTE),
    _claim(text=NSR, source=SOURCE + f" (quoted); tested at k = {MID_K}",
           test=(NEGATIVE, BASE_MODEL, f"pass@{MID_K}"), expect=">", margin=PASS_MARGIN,
           headroom=(BASE_MODEL, f"pass@{MID_K}", 1.0)),
    _claim(text=NSR, source=SOURCE + f" (quoted); tested at k = {LARGE_K}",
           test=(NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"), expect=">", margin=LARGE_MARGIN,
           headroom=(BASE_MODEL, f"pass@{LARGE_K}", 1.0), note=CEILING),
    _claim(text=MATCHING, source=SOURCE + " (quoted, of negative-only training); tested "
           "against GRPO on both signs (no PPO arm) at k = 1: not below it by the margin",
           test=(NEGATIVE, BOTH, "pass@1"), expect=">=", margin=PASS_MARGIN),
    _claim(text=MATCHING, source=SOURCE + " (quoted, of negative-only training); tested "
           f"against GRPO on both signs (no PPO arm) at k = {MID_K}: not below it by the "
           "margin", test=(NEGATIVE, BOTH, f"pass@{MID_K}"), expect=">=",
           margin=PASS_MARGIN),
    _claim(text="reinforcing only correct responses improves Pass@1",
           source=SOURCE + " (quoted)", test=(POSITIVE, BASE_MODEL, "pass@1"), expect=">",
           margin=PASS_MARGIN, note=SIGN_NOTE),
    _claim(text="but degrades performance at higher k",
           source=SOURCE + f" (quoted, of positive-only training); tested at k = {LARGE_K}, "
           "below the base model", test=(POSITIVE, BASE_MODEL, f"pass@{LARGE_K}"),
           expect="<", margin=LARGE_MARGIN),
    _claim(text="due to reduced diversity",
           source=SOURCE + " (quoted, of positive-only training); tested as the policy's "
           "token entropy on its own samples over the last training steps, below the base "
           "model's (the first step's)",
           test=(POSITIVE, BASE_MODEL, "entropy"), expect="<", margin=ENTROPY_MARGIN,
           note="the token entropy of the training samples is one measure of diversity; the "
                "answers' diversity is not measured"),
)

# The family's base (docs/reasoning_gym.md, Results): pass@1 0.10, pass@8 0.55, far from its
# coverage ceiling; completions are a few letters; the reward gives partial credit.
FAMILY_SIGN_NOTE = ("here an arm keeps the tokens whose group-relative advantage (of the "
                    "scorer's partial credit, the share of letters in place, + 0.2 x format) "
                    "has its sign, not the paper's +1 / -1 rewards of correct and incorrect "
                    "samples: a wrong spelling with more letters in place than its group's "
                    "mean counts as positive")
FAMILY_LARGE_K = ("the family's base is far from its coverage ceiling at small k (pass@8 0.55 "
                  "in docs/reasoning_gym.md) but may near it at k = 256 (a 3-5 letter answer "
                  "is a short guess): the headroom test says whether an arm can rise by the "
                  "margin")
# Why each test could fail on the family, by the original's test.
FAMILY_WHY = {
    (NEGATIVE, BASE_MODEL, "pass@1"): (
        "negative-only updates push probability off the sampled wrong spellings, and with the "
        "base at pass@1 0.10 most groups hold no correct one: the mass freed may go to other "
        "wrong spellings and leave pass@1 flat; and under partial credit a near-miss spelling "
        "above its group's mean is a positive sample the negative arm never reinforces"),
    (NEGATIVE, BASE_MODEL, f"pass@{MID_K}"): (
        "the base's pass@16 leaves room (pass@8 0.55), but pushing mass off wrong spellings "
        "may only reshuffle it among other wrong ones, so that no more problems get a correct "
        "spelling among 16 samples"),
    (NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"): (
        "a 3-5 letter answer is a short guess, so 256 samples of the base may solve nearly "
        "every problem and leave less room than the margin (the claim is then not testable "
        "here); or the negative arm's 40 steps may not reach the few problems the base never "
        "solves"),
    (NEGATIVE, BOTH, "pass@1"): (
        "GRPO on both signs raises pass@1 far on this family (0.10 -> 0.84 with the preset's "
        "GRPO stage in docs/reasoning_gym.md) by reinforcing the correct spellings the base "
        "rarely samples, which the negative arm cannot do without the positive term: it may "
        "fall below `both` by more than the margin"),
    (NEGATIVE, BOTH, f"pass@{MID_K}"): (
        "the positive term is what concentrates mass on the correct spelling; at k = 16 "
        "`both` may still lead the negative arm by more than the margin"),
    (POSITIVE, BASE_MODEL, "pass@1"): (
        "under partial credit almost every group has spread, so the positive arm also "
        "reinforces the wrong spellings above their group's mean: it may learn near-misses "
        "and leave pass@1 within the margin of the base's"),
    (POSITIVE, BASE_MODEL, f"pass@{LARGE_K}"): (
        "the family's base is far from its coverage ceiling, and GRPO on both signs raised "
        "pass@8 from 0.55 to 0.99 on it (docs/reasoning_gym.md): a sharpened policy may gain "
        "coverage at k = 256 rather than lose it, or stay within the margin"),
    (POSITIVE, BASE_MODEL, "entropy"): (
        "the base's first-step entropy is that of a weak speller (pass@1 0.10); the positive "
        "arm trains on fewer tokens per step than `both` and in 40 steps may leave its "
        "entropy within the margin, or raise it where partial credit reinforces varied "
        "near-misses"),
}
# The twins' notes where the original's does not hold on the family, by the original's test.
FAMILY_NOTES = {(NEGATIVE, BASE_MODEL, "pass@1"): FAMILY_SIGN_NOTE,
                (NEGATIVE, BASE_MODEL, f"pass@{LARGE_K}"): FAMILY_LARGE_K,
                (POSITIVE, BASE_MODEL, "pass@1"): FAMILY_SIGN_NOTE}


def twin(claim: common.Claim, why: str, note: str | None, family: str = FAMILY) -> common.Claim:
    """`claim` (an arithmetic claim) on `family`: the same text, expectation and margin, its
    source with "; rerun on reasoning-gym's <family>", its test (and headroom) the same
    contrast between the family's arms, its own can-fail statement and note (None: the
    original's)."""
    a, b, metric = claim.test
    headroom = claim.headroom
    if headroom is not None:
        headroom = (named(family, headroom[0]), *headroom[1:])
    return dataclasses.replace(
        claim, test=(named(family, a), named(family, b), metric), headroom=headroom,
        note=claim.note if note is None else note, can_fail="", why=why,
        source=f"{claim.source}; rerun on reasoning-gym's {family}")


CLAIMS = CLAIMS_MAIN + tuple(twin(claim, FAMILY_WHY[claim.test], FAMILY_NOTES.get(claim.test))
                             for claim in CLAIMS_MAIN)


STUDY = common.Study(
    name="negative_samples",
    question="GRPO on the completions above their group's baseline only (positive), below it "
             "only (negative), or both: held-out pass@1 and pass@k up to k = 256 against the "
             "base model, paired by (base, seed), on arithmetic and on reasoning-gym's "
             "spell_backward, each family from its own base",
    tiers=tiers.standard(
        full="about 1.6-2.2 h on 2 cores at 4 bases x 2 seeds (estimated): arithmetic, 24 RL "
             "runs of 60 steps at about 80 s (sharpening's measured figure; the 8 of `both` "
             "pass_at_k's, shared in one workdir) and 32 samplings of 128 x 256 completions at "
             "35-57 s (about 50-60 min); spell_backward, 24 GRPO runs of the preset's 40 steps "
             "and its two evaluations at about 1-1.5 min (80 s in docs/reasoning_gym.md; the 8 "
             "of `both` replication's `spell_backward: all`) and 32 samplings of 128 x 256 at "
             "about 40-60 s (measured: 38-57 s a draw from a family base under a load of about "
             "6, arithmetic's 25 s beside it) (about 45-70 min); plus the shared bases when not "
             "built yet: 4 main bases at about 9 min and 4 spell_backward bases (800 "
             "pretraining steps: 938 s under the heaviest load in docs/reasoning_gym.md), "
             "shared with replication",
        mini="about 1 min on 2 cores (measured: 72 s alone and 48 s in the suite's "
             "shared workdir, under a load of about 6, the toy base built in; one "
             "seed, 3 toy RL runs, 4 samplings of 4 x 256; arithmetic only)",
        mini_arms=ARMS, full_sized=True),
    arms=ALL_ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=families.attach, measure=measure, claims=CLAIMS,
)
