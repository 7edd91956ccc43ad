"""Pretraining against RL: bases pretrained on 100%, 25% and 0% of the task's worked solutions
at equal pretraining compute, then the same GRPO stage from each.

Three bases per base seed (`tiers.FULL_BASES`), roles of one base set, each the main job's
pretraining (configs/default.py: its steps, batch, packing and learning rate) on a corpus of
as many rows, of which a share `pretrain.solution_fraction` are the main job's noisy worked
solutions ("Q: 7+5*3\\nA: <think>5*3=15 7+15=22</think><answer>22</answer>", 30% of steps
wrong, 15% malformed) and the rest filler (`stages.supervised.with_filler`): each filler row
is a worked-solution row of the same corpus with its characters (the think / answer tags as
one piece each) in a seeded random order and no prompt, so it has the row's tokens, its
length and its characters, and no problem, step or answer in order:

  solutions_100  every row a worked solution: the main base (`common.main_base`, shared with
                 every study of the main base)
  solutions_25   the first quarter of the rows kept (the same rows as the main base's, one
                 quarter as many problems seen), the rest filler
  solutions_0    every row filler

Under the char tokenizer a filler row has exactly the tokens of the row it replaces, so the
three corpora pack into the same rows and every base trains on the same tokens per step: equal
pretraining compute. Arms: the main job's GRPO stage (`common.main_arm`: eval_base -> rl ->
eval_final, accuracy + 0.2 x format) from each base; the arm from the main base is the main
job's run, shared with the studies that run it. Measured on the 128 held-out problems fixed
across seeds (task.eval_seed) x 8 samples, before (eval_base) and after (eval_final):
pass@1, pass@8 and the format rate (the share of completions in the answer format; a base
that never saw the format in order may have none, and then no reward for GRPO to act on).
The pseudo-arm `GAP` holds, per (base, seed), the 100% base's pass@1 less the 25% base's: the
headroom of the claim that GRPO from the 25% base stays below the 100% base.
"""

from __future__ import annotations

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import paired, per_arm

# role -> the share of the pretraining rows that are worked solutions
FRACTIONS = {"solutions_100": 1.0, "solutions_25": 0.25, "solutions_0": 0.0}
MAIN_ROLE = "solutions_100"
# role -> (GRPO arm, base pseudo-arm: the same runs' evaluation before RL)
ARM_OF = {role: f"grpo from {round(100 * f)}%" for role, f in FRACTIONS.items()}
BASE_OF = {role: f"base {round(100 * f)}%" for role, f in FRACTIONS.items()}
ARMS = tuple(ARM_OF.values())
FULL, QUARTER, NONE = ARMS
BASE_FULL, BASE_QUARTER, BASE_NONE = BASE_OF.values()
METRICS = ("pass@1", "pass@8", "format_rate")
GAIN = "pass@1_gain"  # held-out pass@1 after RL minus before, per run (`gains`)
# pseudo-arm: per (base, seed), the 100% base's pass@1 less the 25% base's (`gap_arm`)
GAP, GAP_METRIC = "base gap, 100% - 25%", "pass@1_gap"
PASS_MARGIN = 0.03  # 3 points of pass@1: the margin of the other studies of the main base


# ---- configs ------------------------------------------------------------------------------

def role_base(tier: str, role: str):
    """The main base's pretraining with a share FRACTIONS[role] of worked solutions (the
    main base itself, its config untouched, for the 100% role)."""
    config = common.main_base(tier)
    if FRACTIONS[role] != 1.0:
        config.pretrain.solution_fraction = FRACTIONS[role]
    return config


def base_config(tier: str) -> dict:
    """The three bases, each built once per base seed (the 100% role: the main base)."""
    return {role: role_base(tier, role) for role in FRACTIONS}


def arm_config(tier: str, role: str):
    """The main job's GRPO stage with its evaluations before and after, from the base of
    `role`: model.init_from names the role ("" for the main base, so the arm's config is
    the main job's), and `attach` sets the role's directory per base seed."""
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    config.model.init_from = "" if role == MAIN_ROLE else role
    return config


def arm_configs(tier: str) -> dict:
    return {ARM_OF[role]: arm_config(tier, role) for role in FRACTIONS}


def attach(config, base: dict) -> None:
    """Each arm from its role's base: model.init_from holds the role's name ("" for the
    main base) until here."""
    config.model.init_from = base["roles"][config.model.init_from or MAIN_ROLE]


# ---- analysis -----------------------------------------------------------------------------

def gains(values: dict) -> dict:
    """A run's held-out figures (`common.eval_values`: after, and before as "base_<metric>")
    with RL's gain in pass@1 added: GAIN = pass@1 - base_pass@1 (None when either is
    missing)."""
    after, before = values.get("pass@1"), values.get("base_pass@1")
    return {**values, GAIN: None if after is None or before is None else after - before}


def _values(record) -> dict:
    return gains(common.eval_values(record, METRICS))


def gap_arm(arms: dict) -> dict | None:
    """The pseudo-arm GAP: per (base, seed) both base pseudo-arms have, the 100% base's
    pass@1 less the 25% base's (None without both arms): the most that GRPO from the 25%
    base can stay below the 100% base, while RL does not lower pass@1 (the last claim's
    headroom)."""
    if BASE_FULL not in arms or BASE_QUARTER not in arms:
        return None
    full, quarter = arms[BASE_FULL], arms[BASE_QUARTER]
    other = dict(zip(zip(quarter["bases"], quarter["seeds"]), quarter["metrics"]["pass@1"]))
    keys, gaps = [], []
    for key, value in zip(zip(full["bases"], full["seeds"]), full["metrics"]["pass@1"]):
        if key in other:
            keys.append(key)
            gaps.append(None if value is None or other[key] is None else value - other[key])
    return {"bases": [k[0] for k in keys], "seeds": [k[1] for k in keys],
            "metrics": {GAP_METRIC: gaps}}


# The Holm family: the three claims' and the check's contrasts, and RL's gain from each base.
SPECS = [(BASE_FULL, BASE_QUARTER, "pass@1"), (BASE_QUARTER, BASE_NONE, "pass@1"),
         (FULL, QUARTER, GAIN), (QUARTER, BASE_FULL, "pass@1"),
         (FULL, BASE_FULL, "pass@1"), (QUARTER, BASE_QUARTER, "pass@1"),
         (NONE, BASE_NONE, "pass@1")]


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    for role in FRACTIONS:
        common.add_base_arm(arms, ARM_OF[role], METRICS, name=BASE_OF[role])
    order = [name for role in FRACTIONS for name in (BASE_OF[role], ARM_OF[role])]
    arms = {name: arms[name] for name in order if name in arms}
    gap = gap_arm(arms)
    if gap is not None:
        arms[GAP] = gap
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
        plots=tables.bar_plots(arms, (tables.PASS_AT_1, tables.PASS_AT_8,
                                      ("format_rate", "held-out format rate, %", 100.0))),
        protocol={"notes": "bases at equal pretraining steps and batch; a filler row is a "
                           "worked-solution row's characters (tags whole) shuffled, with no "
                           "prompt (stages.supervised.with_filler)"})


def table(arms: dict, config) -> str:
    """The bases and the GRPO arms (pass@1, pass@8, format rate), then RL's paired gain from
    each base (descriptive)."""
    order = [name for role in FRACTIONS for name in (BASE_OF[role], ARM_OF[role])]
    text = tables.arm_table(
        arms, order, ("pass@1", "pass@8", "format rate"),
        tables.metric_row("pass@1", "pass@8", "format_rate"),
        f"In %, mean ± 95% half-width over (base, seed) runs, on "
        f"{tables.rl_caption(config)} (a base: the same runs before RL).")
    lines = ["", "| RL's gain (after - before, paired, points) | pass@1 | pass@8 | "
             "format rate |", "|---|---|---|---|"]
    for role in FRACTIONS:
        a, b = ARM_OF[role], BASE_OF[role]
        if a in arms and b in arms:
            lines.append(f"| from the {b} | " + " | ".join(
                _paired_cell(paired(arms, a, b, m)) for m in METRICS) + " |")
    return text + "\n".join(lines) + "\n"


def _paired_cell(stats: dict) -> str:
    """A paired interval (`arms.paired`: n, mean, ci95) as `common.paired_cell` writes one."""
    return common.paired_cell({"n": stats["n"], "diff": stats["mean"], "ci95": stats["ci95"]})


# ---- claims -------------------------------------------------------------------------------

LECTURE = "the lecture on RL for LLMs (a seed document; close paraphrase)"


def _claim(why: str, **fields) -> common.Claim:
    """A claim whose can_fail says how its test could fail here (`why`), then the rule's own
    statement."""
    return common.Claim(**fields, why=why)


CLAIMS = (
    _claim(
        "it can fail if a quarter of the worked solutions teaches the base as much as all of "
        "them: a model this small may learn the steps' arithmetic and the answer format from "
        "the smaller share within the same steps, the filler rows then costing it nothing "
        "the task needs",
        text="pretraining on math-relevant data is extremely important",
        source=LECTURE + "; tested as the held-out pass@1 of the base pretrained on every "
               "worked solution against the base with a quarter of them, at equal "
               "pretraining compute",
        test=(BASE_FULL, BASE_QUARTER, "pass@1"), expect=">", margin=PASS_MARGIN),
    common.Claim(
        "a quarter of the worked solutions teaches the base the task, where none teaches it "
        "nothing", "this study's check: the 0% base's pass@1 is near zero by construction "
        "(it never saw a problem, a step or the answer tags in order); tested as the held-out "
        "pass@1 of the base with a quarter of the worked solutions against the base with none, "
        "at equal pretraining compute; the claims on the 25% base need it",
        (BASE_QUARTER, BASE_NONE, "pass@1"), ">", margin=PASS_MARGIN, kind="check",
        can_fail="a check, not a claim: the 0% base has nothing of the task in order to learn "
                 "from, so the contrast measures whether the 25% base learned the task at "
                 "all; it fails only if a quarter of the main base's worked solutions, among "
                 "filler, leave that base within the margin of none"),
    _claim(
        "it can fail if GRPO gains as much from the 25% base: a base further below the "
        "task's ceiling has more room to gain, and what RL sharpens here (the answer format, "
        "the confused operator) may be as present in a base that saw a quarter of the "
        "solutions",
        text="pretraining on math-relevant data is extremely important",
        source=LECTURE + "; read here for what RL can reach (this study's reading): RL's "
               "gain is larger from the better-pretrained base; tested as the interaction: "
               "RL's gain in held-out pass@1 from the 100% base minus its gain from the 25% "
               "base",
        test=(FULL, QUARTER, GAIN), expect=">", margin=PASS_MARGIN),
    _claim(
        "it can fail if the main job's GRPO stage lifts the 25% base to within the margin "
        "of the 100% base before RL, or above it: GRPO adds several points of pass@1 to a "
        "base on this task (the table's gain rows), which may be as much as the two bases "
        "differ by. Not testable here (the headroom) when the 100% base lies less than the "
        "margin above the 25% base before RL: no gap for RL to close",
        text="pretraining on math-relevant data is extremely important",
        source=LECTURE + ", which leaves pre-training vs RL as an open question; read here "
               "as \"RL does not replace pretraining\" (this study's hypothesis, fixed "
               "before the runs): GRPO from the 25% base against the 100% base before any RL",
        test=(QUARTER, BASE_FULL, "pass@1"), expect="<", margin=PASS_MARGIN,
        headroom=(GAP, GAP_METRIC, 0.0)),
)

STUDY = common.Study(
    name="pretraining_vs_rl",
    question="bases pretrained on 100%, 25% and 0% of the task's worked solutions (the "
             "rest filler) at equal pretraining compute, then the same GRPO stage: does "
             "the base's pass@1 rise with the share, does RL gain more from the better "
             "base, and does RL from the 25% base reach the 100% base?",
    tiers=tiers.standard(
        full="about 2 h on 2 cores, estimated, when the main bases and the main job's GRPO "
             "runs already exist (every study of the main base builds them): 8 bases on the "
             "25% and 0% corpora at about 9 min each (the main base's pretraining: the same "
             "steps and tokens per step; 3 to 11 min measured for it on this CPU, by load) "
             "and 16 GRPO runs at about 3 min each (the main job's run, its sampling bounded "
             "by the same token limit from any base); about 3 h alone, with the 4 main bases "
             "and the 8 main-job runs",
        mini="about 30-50 s on 2 cores, measured (26 s wall beside other jobs with a warm "
             "compilation cache, 48 s in the suite's test): three toy bases of 3 steps and "
             "three toy GRPO runs, one seed",
        full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
