"""Does GRPO teach a policy to use an environment's feedback, against the same budget without it?

configs/agents.py's job (`config_presets.agents_job`): guess a hidden number in a range of 8 or
16 in at most 5 answered guesses. The base is the job's pretraining (1500 steps; half the noisy
worked solutions bisect on the feedback, half guess at random), built with the full tier's
pretraining seeds (`tiers.FULL_BASES`). From each base and seed, two arms run the same 60 GRPO
steps:

* `feedback`: the environment answers each wrong guess "higher" or "lower"
  (`rl.tools=guess`);
* `blind`: the same turns and tokens, every wrong guess answered "no"
  (`rl.tools=guess_blind`): what the policy can learn without the information.

Each run evaluates the policy before and after GRPO in both environments (the held-out
problems fixed across seeds, the evaluation keys the seed's), so every figure is paired by
(base, seed). The summary's arms are the three policies a run shows: the base (from the
feedback runs' evaluations before GRPO; the blind runs evaluate the same base with the same
keys), GRPO with feedback and GRPO blind. Their metrics, all on the same held-out problems:
pass@1 with feedback, pass@1 blind, `pass@1_gain` (their difference: how much the policy
gains from the information, the study's measure of using it) and `turns_to_success` (the
guesses of the successful episodes, with feedback).
"""

from __future__ import annotations

import copy
import math

from grpo_jax import sweep
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, tiers

FEEDBACK, BLIND = "feedback", "blind"  # the run arms (their RL environment)
TOOLS = {FEEDBACK: "guess", BLIND: "guess_blind"}
BASE, GRPO_FEEDBACK, GRPO_BLIND = "base", "GRPO with feedback", "GRPO blind"
# summary arm -> (run arm, eval stage with feedback, eval stage without)
POLICIES = {BASE: (FEEDBACK, "eval_base", "eval_base_blind"),
            GRPO_FEEDBACK: (FEEDBACK, "eval_final", "eval_final_blind"),
            GRPO_BLIND: (BLIND, "eval_final", "eval_final_blind")}
METRICS = ("pass@1", "pass@1_blind", "pass@1_gain", "turns_to_success", "tool_calls")
CURVES = ("reward/environment", "tool_calls", "reward_std")
PASS_MARGIN = 0.03  # 3 points of pass@1 (or of its gain)
TURNS_MARGIN = 0.1  # a tenth of a guess per successful episode
# the mini tier's pretraining steps (the smoke preset's 60 cost more than the runs): enough
# for the toy base to guess in the environment's format, so the episodes have turns
MINI_STEPS = 10

SPECS = [
    (GRPO_FEEDBACK, BASE, "pass@1"),
    (GRPO_FEEDBACK, GRPO_BLIND, "pass@1"),
    (GRPO_FEEDBACK, GRPO_BLIND, "turns_to_success"),
    (GRPO_FEEDBACK, BASE, "pass@1_gain"),
    (GRPO_BLIND, BASE, "pass@1_gain"),
    (GRPO_BLIND, BASE, "pass@1"),
]


def base_config(tier: str):
    """The agents job's pretraining (1500 steps; `MINI_STEPS` of the smoke preset's sizes at
    the mini tier)."""
    config = common.agents_job(common.preset(tier))
    config.stages = "pretrain"
    if tier != "full":
        config.pretrain.steps = MINI_STEPS
    return config


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: both environments evaluated before and after GRPO in `arm`'s
    environment, from the base in model.init_from (set per base by the study)."""
    config = common.agents_job(common.preset(tier))
    config.stages = "eval_base,eval_base_blind,rl,eval_final,eval_final_blind"
    del config.pretrain
    for name in ("eval_base", "eval_final"):
        config[f"{name}_blind"] = copy.deepcopy(config[name])
        config[f"{name}_blind"].tools = TOOLS[BLIND]
    config.rl.tools = TOOLS[arm]
    config.model.init_from = ""  # the base's workdir, set by the study per base
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in (FEEDBACK, BLIND)}


def _figures(rows: dict, with_stage: str, blind_stage: str) -> dict:
    seen, blind = rows.get(with_stage, {}), rows.get(blind_stage, {})
    values = {"pass@1": seen.get("pass@1"), "pass@1_blind": blind.get("pass@1"),
              "turns_to_success": seen.get("turns_to_success"),
              "tool_calls": seen.get("tool_calls")}
    if values["pass@1"] is not None and values["pass@1_blind"] is not None:
        values["pass@1_gain"] = values["pass@1"] - values["pass@1_blind"]
    return values


def _rl_rows(record) -> list[dict]:
    return [row for row in common.training_rows(record) if row.get("stage", "rl") == "rl"]


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = {}
    for label, (run_arm, with_stage, blind_stage) in POLICIES.items():
        finished = [r for r in runs.arm(run_arm) if r.finished]
        if not finished:
            continue
        rows = [_figures(common.last_stage_rows(r), with_stage, blind_stage)
                for r in finished]
        arms[label] = {"seeds": [r.seed for r in finished], "bases": [r.base for r in finished],
                       "metrics": {m: [row.get(m) for row in rows] for m in METRICS}}
    curves = {arm: [_rl_rows(r) for r in runs.arm(arm) if r.finished]
              for arm in (FEEDBACK, BLIND)}
    training = {}
    for arm, series in curves.items():
        training[arm] = {}
        for name in CURVES:
            first = [rows[0].get(name, math.nan) for rows in series if rows]
            last = [sum(r.get(name, math.nan) for r in rows[-10:]) / len(rows[-10:])
                    for rows in series if rows]
            training[arm][name] = {"first_step": first, "last_10_steps": last}
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, training),
                           extra={"training": training},
                           plots=lambda out: plot(arms, curves, out))


def table(arms: dict, training: dict) -> str:
    """The three policies on the held-out problems (mean ± 95% half-width over runs) and the
    training rollouts' first and last steps."""
    lines = ["| policy | runs | pass@1 with feedback | pass@1 blind | gain from the feedback "
             "| guesses to success | guesses per episode |", "|---|---|---|---|---|---|---|"]
    for label, entry in arms.items():
        metrics = entry["metrics"]
        lines.append(f"| {label} | {len(entry['seeds'])} | {common.cell(metrics['pass@1'])} | "
                     f"{common.cell(metrics['pass@1_blind'])} | "
                     f"{common.cell(metrics['pass@1_gain'])} | "
                     f"{common.cell(metrics['turns_to_success'], 1.0, 2)} | "
                     f"{common.cell(metrics['tool_calls'], 1.0, 2)} |")
    fmt = sweep.format_interval
    lines += ["", "| during GRPO (training rollouts) | first step | last 10 steps | change "
                  "(paired) |", "|---|---|---|---|"]
    for arm, curves in training.items():
        for name, values in curves.items():
            scale = 100.0 if name == "reward/environment" else 1.0
            first, last = values["first_step"], values["last_10_steps"]
            lines.append(f"| {arm}: {name} | {fmt(interval(first), scale, 2)} | "
                         f"{fmt(interval(last), scale, 2)} | "
                         f"{fmt(paired_interval(last, first), scale, 2, signed=True)} |")
    lines += ["", ("pass@1 in %, guesses per episode; \"runs\" counts (base, seed) pairs. The "
                   "gain from the feedback is pass@1 with feedback minus pass@1 blind for the "
                   "same policy and problems. reward/environment is the fraction of training "
                   "episodes that found the number (in %), in the arm's own environment.")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, curves: dict, out: str) -> None:
    """pass_at_1.png (each policy with and without feedback) and curves.png (the training
    rollouts' success and guesses over the GRPO steps, mean ± 1 std over runs)."""
    import numpy as np

    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = list(arms)
    for offset, (metric, name, color) in enumerate((("pass@1", "with feedback", "C0"),
                                                     ("pass@1_blind", "blind", "C7"))):
        means, halves = common.error_bars(
            [interval([v for v in arms[label]["metrics"][metric] if v is not None])
             for label in labels], 100)
        ax.bar(np.arange(len(labels)) + 0.38 * offset, np.nan_to_num(means), width=0.36,
               yerr=np.nan_to_num(halves), capsize=3, color=color, label=f"evaluated {name}")
    ax.set_xticks(np.arange(len(labels)) + 0.19, labels, fontsize=8)
    ax.set_ylabel("held-out pass@1, %")
    ax.set_title("each policy with and without the feedback, 95% interval", fontsize=9)
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "pass_at_1.png")

    common.curve_panels(curves, (("reward/environment", "found the number (training)"),
                                 ("tool_calls", "guesses per episode")), out)


SOURCE = ("the question this study was built to answer, as first posed: \"does GRPO teach "
          "the policy to use the environment's feedback (success rate up, turns to success "
          "down), against the same budget without feedback?\"")
CLAIMS = (
    common.Claim("GRPO with the environment's feedback raises the success rate",
                 SOURCE, (GRPO_FEEDBACK, BASE, "pass@1"), ">", margin=PASS_MARGIN,
                 why="the base already bisects on the feedback in half its worked "
                     "solutions, and with 5 answered guesses on a range of 8 or 16 even "
                     "its random guessing often finds the number: GRPO adds only by "
                     "moving episodes from random guessing to bisection, and the test "
                     "fails when 60 steps move too few to raise pass@1 by 3 points",
                 note="the base already bisects in about half its worked solutions"),
    common.Claim("... against the same budget without feedback: the success rate is higher "
                 "after GRPO with feedback than after GRPO blind",
                 SOURCE, (GRPO_FEEDBACK, GRPO_BLIND, "pass@1"), ">", margin=PASS_MARGIN,
                 why="both arms start from the same base, and what blind training rewards "
                     "(well-formed guesses, no guess repeated, the range covered within "
                     "the turns) also raises success with feedback: the test fails if the "
                     "feedback arm's gain comes mostly from those shared skills rather "
                     "than from acting on the answers"),
    common.Claim("turns to success down, against the same budget without feedback",
                 SOURCE, (GRPO_FEEDBACK, GRPO_BLIND, "turns_to_success"), "<",
                 margin=TURNS_MARGIN,
                 why="guesses are counted on successful episodes only and both policies "
                     "are evaluated with feedback: the blind-trained policy succeeds where "
                     "it still bisects or guesses right early, both short, "
                     "while the feedback-trained policy also succeeds on episodes that take "
                     "more guesses; and the small ranges (bisection needs at most 4) leave "
                     "little room below a tenth of a guess",
                 note="guesses of the successful episodes only: a policy that succeeds on "
                      "harder problems can take more"),
    common.Claim("GRPO teaches the policy to use the feedback: its gain from the feedback "
                 "(pass@1 with it minus pass@1 blind) grows",
                 SOURCE, (GRPO_FEEDBACK, BASE, "pass@1_gain"), ">", margin=PASS_MARGIN,
                 why="GRPO can raise pass@1 through what helps in both environments "
                     "(well-formed guesses, none repeated), which leaves the gain from the "
                     "feedback unchanged; the gain grows only if the policy acts on the "
                     "answers more than the base, which already bisects in half its "
                     "worked solutions"),
)

STUDY = common.Study(
    name="env_feedback",
    question="does GRPO teach a tiny model to use a stateful environment's feedback (guess a "
             "hidden number: higher / lower), against the same budget without the feedback, "
             "paired by seed?",
    tiers=tiers.standard(
        full="about 35 min on 2 cores (estimated: 2 bases of 1500 steps, "
             "about 6 min each; 12 runs of 60 GRPO steps with four "
             "evaluations, about 2 min each)",
        mini="about 20 s of CPU on 2 cores, measured (18-20 s for its test alone, which "
             "compiles every program itself): a toy base of 10 steps, one seed of the 2 "
             "arms' toy runs"),
    arms=(FEEDBACK, BLIND), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
