"""Does GRPO on multi-turn episodes teach a tiny model to use a calculator, and from which base?

configs/tools.py's job (`config_presets.tool_job`) from two pretrained bases per base seed:

* `base`: the tool job's pretraining (operands of 3-4 digits; most noisy worked solutions
  call the calculator), chosen by a rule fixed before the runs: pretrain in rounds of the
  job's pretraining steps, each followed by an evaluation with the tool on validation
  problems (test-split problems drawn with `VALIDATION_SEED`, not the held-out problems'
  seed), and stop at the first round whose validation pass@1 with the tool reaches
  `VALIDATION_BAR`, at most `ROUNDS` rounds (the last one built when none does). Round 1 is
  the job's pretraining; each later round continues the one before it (model.init_from) on
  a fresh draw of the pretraining corpus (its stage, `pretrain_<k>`, draws by its name),
  with a fresh optimizer and the stage's learning-rate schedule from its start.
  Why: at one setting the base's tool use depends on the pretraining draw
  (experiments/tool_use/README.md, "Why the bases differ"), so a base fixed by its step
  count alone may have no tool use to sharpen. Each round's validation figures and the
  round chosen are in the summary's `extra["bases"]`.
* `former`: the configuration the study was first run with and replaced (configs/tools.py
  before ea5240e: 1000 steps; operands of 3-5 digits; 50% of the worked solutions call,
  30% disturbed), one round, as it was run: the failed setup, reported as an arm.

Arm `grpo` (from `base`): evaluate with and without the tool, 60 GRPO steps on episodes with
the calculator, evaluate with and without the tool again. Arm `former` (from `former`, on
its own task): evaluate with the tool, the same 60 GRPO steps, evaluate with the tool. The
held-out problems are fixed across seeds (task.eval_seed); the seed sets the RL prompt order
and every sampling key, so a run's evaluations are paired. The summary's arms are the held-
out conditions (each run's eval stages); the contrasts are within a run, before against
after GRPO (and with against without the tool). The two families differ in the base and
the task, so nothing is contrasted across them.
"""
from __future__ import annotations

import math

import ml_collections

from grpo_jax import storage, sweep
from grpo_jax.results import FinishedRun
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, tiers
from grpo_jax.studies import summary as summary_lib

RUN = "grpo"  # from the tool job's base
FORMER = "former"  # from the former configuration's base
ROLE = {RUN: "base", FORMER: "former"}  # run arm -> the base role it starts from
_ROLE_MARK = "role:"  # model.init_from of an arm until `attach` sets the role's workdir

# The rule that chooses the `base` role, fixed before the runs: rounds of pretraining, each
# evaluated with the tool on validation problems, until validation pass@1 reaches the bar.
VALIDATION_SEED = 1  # the validation problems' seed (the held-out problems': task.eval_seed)
VALIDATION_STAGE = "eval_valid"
# validation pass@1 with the tool a round must reach: at pass@1 p a group of 8 episodes
# holds a correct one with probability 1 - (1 - p)^8, 57% at p = 0.1, so most of GRPO's
# groups carry a signal of the accuracy reward from its first step
VALIDATION_BAR = 0.10
ROUNDS = 3  # at most this many rounds of the job's pretraining steps
ROUND_ROLES = ("base", *(f"base round {k}" for k in range(2, ROUNDS + 1)))
# a mini-tier round's pretraining steps (of the smoke preset's sizes): enough to run the
# rounds' chain end to end; no toy round reaches the bar at this size or at the preset's 60
MINI_STEPS = 10

# eval stage -> summary arm, per run arm
STAGES = {RUN: {"eval_base": "before, with the tool", "eval_base_no_tool": "before, without",
                "eval_final": "after GRPO, with the tool",
                "eval_final_no_tool": "after GRPO, without"},
          FORMER: {"eval_base": "former base: before, with the tool",
                   "eval_final": "former base: after GRPO, with the tool"}}
BEFORE, AFTER = STAGES[RUN]["eval_base"], STAGES[RUN]["eval_final"]
BEFORE_NO_TOOL = STAGES[RUN]["eval_base_no_tool"]
FORMER_BEFORE, FORMER_AFTER = STAGES[FORMER]["eval_base"], STAGES[FORMER]["eval_final"]
FIGURES = ("pass@1", "pass@8", "correct_call_rate", "tool_call_rate", "tool_errors",
           "format_rate", "mean_length")
CURVES = ("tool_call_rate", "reward/correct_call", "pass@1", "turns", "tool_errors")
MARGIN = 0.05  # 5 points of correct calls: see experiments/tool_use/README.md

# (label, a, b, metric): a - b within a run, the Holm family
CONTRASTS = (
    ("GRPO, with the tool", AFTER, BEFORE, "correct_call_rate"),
    ("GRPO, with the tool", AFTER, BEFORE, "pass@1"),
    ("the tool, before GRPO", BEFORE, BEFORE_NO_TOOL, "pass@1"),
    ("GRPO from the former base", FORMER_AFTER, FORMER_BEFORE, "correct_call_rate"),
    ("GRPO from the former base", FORMER_AFTER, FORMER_BEFORE, "pass@1"),
)
SPECS = [(a, b, metric) for _, a, b, metric in CONTRASTS]


def _former(config, tier: str):
    """The former configuration's task and pretraining on a tool job config (configs/tools.py
    at ea5240e^): operands of 3-5 digits, half the worked solutions calling, 30% disturbed,
    1000 pretraining steps (at the mini tier a round's `MINI_STEPS`, so that it runs the
    rounds' compiled programs)."""
    config.task.kwargs = ml_collections.ConfigDict({"difficulty": (1, 2, 3), "tool_rate": 0.5})
    config.task.solution_error_rate = 0.3
    if "pretrain" in config:
        config.pretrain.steps = 1000 if tier == "full" else MINI_STEPS
    return config


def _pretrain(tier: str):
    """The tool job's pretraining (the mini tier: `MINI_STEPS` of the smoke preset's)."""
    config = common.tool_job(common.preset(tier))
    config.stages = "pretrain"
    if tier != "full":
        config.pretrain.steps = MINI_STEPS
    return config


def _round(tier: str, k: int, previous: str | None = None):
    """Round `k` of the base's pretraining: the job's pretraining steps (as stage `pretrain`
    in round 1, `pretrain_<k>` after it: a fresh draw of the corpus and batch order, from
    the round before in model.init_from), then the evaluation with the tool on the
    validation problems."""
    config = _pretrain(tier)
    stage = "pretrain" if k == 1 else f"pretrain_{k}"
    if k > 1:
        config[stage] = ml_collections.ConfigDict(config.pretrain.to_dict())
        del config.pretrain
        config.model.init_from = previous
    config[VALIDATION_STAGE] = ml_collections.ConfigDict(config.eval_base.to_dict())
    config.stages = f"{stage},{VALIDATION_STAGE}"
    config.task.eval_seed = VALIDATION_SEED
    return config


def validation(workdir: str) -> dict | None:
    """A finished round's validation figures (its `eval_valid` row), or None."""
    if not storage.isfile(storage.join(workdir, "report.json")):
        return None
    return FinishedRun(workdir).stage_rows().get(VALIDATION_STAGE)


def passes(figures: dict | None) -> bool:
    """The rule's bar: validation pass@1 with the tool at least `VALIDATION_BAR`."""
    return figures is not None and figures.get("pass@1", 0.0) >= VALIDATION_BAR


def _later_round(tier: str, k: int):
    """Round k > 1 as a function of the rounds built before it: None (not built) once a
    round before it passed the bar."""
    def config(roles):
        try:
            previous = roles[ROUND_ROLES[k - 2]]
        except KeyError:  # the round before was not built: an earlier one passed
            return None
        return None if passes(validation(previous)) else _round(tier, k, previous)
    return config


def base_config(tier: str) -> dict:
    """The rounds of the tool job's pretraining (2500 steps each; `MINI_STEPS` at the mini
    tier), each built only while none before it passed the bar, and the former
    configuration's pretraining (1000 steps; `MINI_STEPS`)."""
    rounds = {ROUND_ROLES[0]: _round(tier, 1)}
    rounds.update({ROUND_ROLES[k - 1]: _later_round(tier, k) for k in range(2, ROUNDS + 1)})
    return {**rounds, "former": _former(_pretrain(tier), tier)}


def chosen_round(roles: dict) -> str:
    """The rule's base among the built rounds ({role: workdir}): the first that passes the
    bar, else the last built."""
    built = [role for role in ROUND_ROLES if role in roles]
    return next((role for role in built if passes(validation(roles[role]))), built[-1])


def arm_config(tier: str = "full"):
    """The `grpo` arm's run: four evaluations around the RL stage, from the base in
    model.init_from (set per base by the study)."""
    config = common.tool_job(common.preset(tier))
    config.stages = "eval_base,eval_base_no_tool,rl,eval_final,eval_final_no_tool"
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    return config


def former_arm_config(tier: str = "full"):
    """The `former` arm's run: the same RL stage on the former configuration's task, with
    the evaluations with the tool only."""
    config = _former(arm_config(tier), tier)
    config.stages = "eval_base,rl,eval_final"
    del config.eval_base_no_tool, config.eval_final_no_tool
    return config


def arm_configs(tier: str) -> dict:
    arms = {RUN: arm_config(tier), FORMER: former_arm_config(tier)}
    for name, config in arms.items():
        config.model.init_from = _ROLE_MARK + ROLE[name]
    return arms


def attach(config, base: dict) -> None:
    """The arm's base: the role its model.init_from names."""
    role = config.model.init_from
    if not role.startswith(_ROLE_MARK):
        raise ValueError(f"tool_use: model.init_from {role!r} names no base role")
    role = role[len(_ROLE_MARK):]
    if role == ROUND_ROLES[0]:
        role = chosen_round(base["roles"])
    config.model.init_from = base["roles"][role]


def _rl_rows(record) -> list[dict]:
    rows = common.training_rows(record)
    return [row for row in rows if row.get("stage") == "rl"] or rows


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms, rl_rows, training = {}, {}, {}
    for run_arm, stages in STAGES.items():
        finished = [r for r in runs.arm(run_arm) if r.finished]
        if not finished:
            continue
        stage_rows = [common.last_stage_rows(r) for r in finished]
        for stage, label in stages.items():
            metrics = {name: [rows.get(stage, {}).get(name) for rows in stage_rows]
                       for name in FIGURES}
            arms[label] = {"seeds": [r.seed for r in finished],
                           "bases": [r.base for r in finished],
                           "metrics": {k: v for k, v in metrics.items()
                                       if any(x is not None for x in v)}}
        rl_rows[run_arm] = [_rl_rows(r) for r in finished]
        training[run_arm] = {}
        for name in CURVES:
            first = [rows[0].get(name, math.nan) for rows in rl_rows[run_arm] if rows]
            last = [sum(r.get(name, math.nan) for r in rows[-10:]) / len(rows[-10:])
                    for rows in rl_rows[run_arm] if rows]
            training[run_arm][name] = {"first_step": first, "last_10_steps": last}
    selection = base_selection(runs.bases)
    return common.Analysis(arms=arms, specs=SPECS,
                           table=selection_table(selection) + "\n" + table(arms, training),
                           extra={"training": training, "bases": selection},
                           plots=lambda out: plot(arms, rl_rows, out))


def base_selection(bases: dict) -> dict:
    """{base key: {"rounds": {role: its validation figures}, "chosen": role, "passed":
    bool}}: what the rule saw of each base's rounds and which it chose."""
    out = {}
    for key, info in bases.items():
        roles = info.get("roles", {})
        rounds = {role: validation(roles[role]) for role in ROUND_ROLES if role in roles}
        if not rounds:
            continue
        chosen = chosen_round(roles)
        out[key] = {"rounds": {role: {name: figures.get(name) for name in FIGURES}
                               if figures else None for role, figures in rounds.items()},
                    "chosen": chosen, "passed": passes(rounds[chosen])}
    return out


def selection_table(selection: dict) -> str:
    """Per base and round: the validation figures the rule read, and the round it chose."""
    lines = [(f"The base's rounds (validation: {VALIDATION_STAGE}, problems drawn with seed "
              f"{VALIDATION_SEED}; the rule takes the first round whose pass@1 with the tool "
              f"reaches {100 * VALIDATION_BAR:.0f}%, else the last of {ROUNDS}):"), "",
             ("| base | round | pass@1 | correct tool use | episodes with a call | "
              "chosen |"), "|---|---|---|---|---|---|"]
    for key, entry in selection.items():
        for role, figures in entry["rounds"].items():
            def pct(name, figures=figures):
                value = (figures or {}).get(name)
                return "-" if value is None else f"{100 * value:.1f}%"
            mark = ("yes" if entry["passed"] else "yes (none passed)") \
                if role == entry["chosen"] else ""
            lines.append(f"| {key} | {role} | {pct('pass@1')} | {pct('correct_call_rate')} | "
                         f"{pct('tool_call_rate')} | {mark} |")
    return "\n".join(lines) + "\n"


def table(arms: dict, training: dict) -> str:
    """The held-out conditions (mean ± 95% half-width over runs), the within-run differences
    (95% interval, seeds nested in bases; pass@8 and the tool's effect after GRPO outside
    the Holm family) and tool use over the GRPO steps."""
    fmt = sweep.format_interval
    lines = [("| held-out | runs | pass@1 | pass@8 | correct tool use | episodes with a call | "
              "tool errors per episode |"), "|---|---|---|---|---|---|---|"]
    for label, entry in arms.items():

        def cell(name, scale=100.0, metrics=entry["metrics"]):
            values = [v for v in metrics.get(name, []) if v is not None]
            return fmt(interval(values), scale) if values else "-"

        lines.append(f"| {label} | {len(entry['seeds'])} | {cell('pass@1')} | "
                     f"{cell('pass@8')} | {cell('correct_call_rate')} | "
                     f"{cell('tool_call_rate')} | {cell('tool_errors', 1.0)} |")
    rows = (("GRPO, with the tool", AFTER, BEFORE),
            ("GRPO, without the tool", STAGES[RUN]["eval_final_no_tool"], BEFORE_NO_TOOL),
            ("the tool, before GRPO", BEFORE, BEFORE_NO_TOOL),
            ("the tool, after GRPO", AFTER, STAGES[RUN]["eval_final_no_tool"]),
            ("GRPO from the former base, with the tool", FORMER_AFTER, FORMER_BEFORE))
    lines += ["", ("| paired difference (same base and seed), points | pass@1 | pass@8 | "
                   "correct tool use |"), "|---|---|---|---|"]
    for label, a, b in rows:
        if a not in arms or b not in arms:
            continue
        cells = [common.paired_cell(summary_lib.contrasts(arms, [(a, b, m)])[0])
                 if m in arms[a]["metrics"] and m in arms[b]["metrics"] else "-"
                 for m in ("pass@1", "pass@8", "correct_call_rate")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", ("| during GRPO (training rollouts) | first step | last 10 steps | "
                   "change (paired) |"), "|---|---|---|---|"]
    for run_arm, curves in training.items():
        for name, values in curves.items():
            scale = 1.0 if name in ("turns", "tool_errors") else 100.0
            first, last = values["first_step"], values["last_10_steps"]
            prefix = "former base: " if run_arm == FORMER else ""
            lines.append(f"| {prefix}{name} | {fmt(interval(first), scale, 2)} | "
                         f"{fmt(interval(last), scale, 2)} | "
                         f"{fmt(paired_interval(last, first), scale, 2, signed=True)} |")
    lines += ["", ("Rates in %, differences in points (95% interval); \"runs\" counts (base, "
                   "seed) pairs. The former base runs on its own task (3-5 digit operands), so "
                   "its rows compare with each other only.")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, rl_rows: dict, out: str) -> None:
    """pass_at_1.png (pass@1 and correct tool use in each held-out condition) and curves.png
    (tool use and training pass@1 over the GRPO steps, mean ± 1 std over runs, both bases)."""
    import numpy as np

    plt = common.pyplot()
    labels = list(arms)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, metric, title in zip(axes, ("pass@1", "correct_call_rate"),
                                 ("held-out pass@1", "held-out correct tool use")):
        means, halves = common.error_bars(
            [interval([v for v in arms[label]["metrics"].get(metric, []) if v is not None])
             for label in labels], 100)
        colors = ["C3" if label.startswith("former") else
                  ("C7" if label.endswith("without") else "C0") for label in labels]
        ax.bar(range(len(labels)), np.nan_to_num(means), yerr=np.nan_to_num(halves),
               capsize=4, color=colors)
        ax.set_xticks(range(len(labels)),
                      [label.replace(": ", ":\n").replace(", ", ",\n") for label in labels],
                      fontsize=6)
        ax.set_ylabel("%")
        ax.set_title(f"{title}, 95% interval over runs", fontsize=9)
    common.save_figure(fig, out, "pass_at_1.png")

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for run_arm, runs_rows in rl_rows.items():
        style = "former base" if run_arm == FORMER else "base"
        for ax, names in zip(axes, (("tool_call_rate", "reward/correct_call"), ("pass@1",),
                                    ("turns", "tool_errors"))):
            for index, name in enumerate(names):
                color = f"C{index + (3 if run_arm == FORMER else 0)}"
                common.band(ax, [[r.get(name, np.nan) for r in rows] for rows in runs_rows],
                            label=f"{style}: {name}", color=color)
    for ax, title in zip(axes, ("tool use (training rollouts)", "training pass@1",
                                "turns and tool errors per episode")):
        ax.set_xlabel("GRPO step")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
    common.save_figure(fig, out, "curves.png")


CLAIMS = (
    common.Claim(
        "an automated RL paradigm that allows policy rollouts with multi-turn real-time code "
        "execution and teaches the model in learning when and how to invoke tools based on "
        "outcome feedback",
        "ReTool: Feng et al. 2025, arXiv:2504.11536, abstract (quoted); its RL starts from a "
        "cold start on tool-integrated traces, as this base's pretraining is; tested as: "
        "GRPO raises the held-out rate of correct calls",
        (AFTER, BEFORE, "correct_call_rate"), ">", margin=MARGIN,
        headroom=(BEFORE, "correct_call_rate", 1.0),
        why="correct calls are logged, not rewarded: an episode earns the accuracy reward "
            "only when the right call is followed by its result copied right, so GRPO can "
            "raise pass@1 by fixing the copy on episodes that already call right, or by "
            "answering in head where that works, without moving the rate of correct calls "
            "by the margin; a base the rule takes after three rounds without reaching the "
            "bar also gives few groups a correct episode to learn from",
        note="each base is the first round of its pretraining whose validation pass@1 with "
             "the tool reached the bar, the last round where none did (extra.bases): where "
             "it reached the bar, GRPO here sharpens a tool use the base already has"),
    common.Claim(
        "ToRL enables models to discover optimal strategies for tool utilization via "
        "unrestricted exploration",
        "ToRL: Li, Zou, Liu 2025, arXiv:2503.23383 (v1 abstract, quoted; RL from base models "
        "without post-training); tested on the former base, whose calls are almost never on "
        "the right expression: GRPO raises its held-out rate of correct calls",
        (FORMER_AFTER, FORMER_BEFORE, "correct_call_rate"), ">", margin=MARGIN,
        why="the former base's calls almost never hold the right expression, and its 3-5 "
            "digit operands are beyond answering in head, so few of a group's 8 episodes "
            "earn the accuracy reward and most groups carry no advantage: the test fails "
            "when correct calls appear too rarely in 60 steps' rollouts for the reward to "
            "reinforce them (the calls themselves are not rewarded)",
        note="ToRL's Qwen2.5-Math bases can already write executable code; the former base "
             "writes calls with miscopied operands (its rates: the table)"),
    common.Claim(
        "GRPO sharpens tool use the base already has and does not create it: from a base "
        "whose calls are almost never correct, 60 GRPO steps leave the rate of correct calls "
        "within 5 points of where it was",
        "this study's reading of its former runs (experiments/tool_use/README.md at "
        "b3fa147, on the 1000-step base: 'GRPO has nothing to start from there'), the "
        "claim the evidence supports, with the ReTool row above for its first half; fixed "
        "before these runs",
        (FORMER_AFTER, FORMER_BEFORE, "correct_call_rate"), "=", margin=MARGIN,
        why="a base that miscopies operands now and then still writes the right expression "
            "in some episodes, and GRPO gives such an episode a large advantage in a group "
            "of wrong ones: the test fails if those rare rewarded calls are enough for 60 "
            "steps to raise the rate of correct calls by 5 points or more"),
    common.Claim(
        "Observations masked from the loss keep training on the policy's own tokens only",
        "multi-turn tool RL (ReTool, arXiv:2504.11536, masks the interpreter's output from "
        "the loss; verl, SkyRL likewise; paraphrase)",
        None,
        untestable="a property of the loss, not a contrast: tests/test_tool_rl.py checks "
                   "that observation tokens carry no gradient, and each run's logp_diff_max "
                   "(sampler against learner log-probs of the policy's tokens) stays at "
                   "float32 rounding"),
    common.Claim(
        "while RLVR-trained models outperform their base models at smaller values of k (e.g., "
        "k=1), base models achieve higher pass@k score when k is large",
        "Yue et al. 2025, arXiv:2504.13837, abstract (quoted)",
        None,
        untestable="8 samples per problem: k = 8 is not the large k the claim is about "
                   "(where base and RL curves cross, tens to hundreds of samples); the "
                   "pass_at_k study measures it; pass@8 before and after is in the table"),
)

STUDY = common.Study(
    name="tool_use",
    question="does GRPO on multi-turn episodes teach a tiny model to use a calculator (3-4 "
             "digit + - *), from a base chosen by a validation bar on its tool use and from "
             "the former base that could not (3-5 digits), paired by seed?",
    tiers=tiers.standard(
        full="about 2-4 hours on 2 cores at 4 bases x 2 seeds (estimated from the "
             "recorded base 660 s and runs 131-240 s: the bases 4 x (1 to 3 rounds of "
             "660 s + 265 s) = 62-185 min, as many rounds as miss the bar, which no run "
             "can say in advance; the former bases pro rata 1000/2500 steps, about 18 "
             "min; 16 runs of 60 GRPO steps with their evaluations, about 48 min)",
        full_sized=True,
        mini="about 25 s of CPU on 2 cores, measured (23-24 s for its test alone, which "
             "compiles every program itself; 30 s wall): three toy rounds of 10 steps, "
             "none at the bar, the former toy base of 10, one seed of the 2 arms' toy "
             "runs"),
    arms=(RUN, FORMER), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
