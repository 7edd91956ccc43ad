"""Does a reward with no information about correctness still raise pass@1?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; seeds 0 and 1), four arms of the same GRPO stage that differ only in the
reward (`rl.rewards`):

* `ground truth`: accuracy + 0.2 x format (the main job's);
* `format`: the strict format reward alone (the tags in order), whatever the answer;
* `random`: a coin flip per (problem, completion) (`rewards.spurious.random_reward`);
* `incorrect`: 1 for a wrong or missing answer, 0 for a right one
  (`rewards.spurious.incorrect_reward`).

Every arm samples and scores on the host (`rl.fused_steps = 0`: the random and incorrect
rewards are not device rewards) and evaluates before and after GRPO on the same held-out
problems. The base's pass@1 is the ground-truth runs' evaluation before GRPO.
"""

from __future__ import annotations

from grpo_jax.studies import common, jobs, tables, tiers
from grpo_jax.studies.arms import per_arm

TRUE, FORMAT, RANDOM, INCORRECT = "ground truth", "format", "random", "incorrect"
REWARDS = {TRUE: {"accuracy": 1.0, "format": 0.2}, FORMAT: {"format": 1.0},
           RANDOM: {"random": 1.0}, INCORRECT: {"incorrect": 1.0}}
METRICS = ("pass@1", "format_rate", "mean_length")
PASS_MARGIN = 0.03

SPECS = [(RANDOM, "base", "pass@1"), (FORMAT, "base", "pass@1"),
         (INCORRECT, "base", "pass@1"), (TRUE, "base", "pass@1"), (TRUE, RANDOM, "pass@1"),
         (FORMAT, "base", "format_rate")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: the held-out evaluation, the main job's GRPO stage on the arm's reward,
    the evaluation again, from the base in model.init_from."""
    return jobs.host_rewards(common.main_arm(tier, "eval_base,rl,eval_final"), REWARDS[arm])


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in REWARDS}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, lambda r: common.eval_values(r, METRICS), REWARDS)
    common.add_base_arm(arms, TRUE, METRICS)
    curves = common.arm_curves(runs, REWARDS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
                           plots=lambda out: plot(curves, out))


def table(arms: dict, config) -> str:
    return tables.arm_table(
        arms, ("base", *REWARDS), ("pass@1", "format rate", "mean length"),
        tables.metric_row("pass@1", "format_rate", ("mean_length", 1.0, 1)),
        "pass@1 and format rate in %, mean length in tokens; mean ± 95% half-width over (base, "
        f"seed) runs, {tables.rl_caption(config)} on each reward (the base: before).")


def plot(curves: dict, out: str) -> None:
    """curves.png: training accuracy and length over the GRPO steps per reward."""
    common.curve_panels(curves, (("reward/accuracy", "training accuracy (where logged)"),
                                 ("completion_length", "completion length")), out)


SOURCE = ("Shao et al. 2025, \"Spurious Rewards: Rethinking Training Signals in RLVR\", "
          "arXiv:2506.10947, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("RLVR raises performance even with a random reward, one with no correlation "
                 "with the correct answer", SOURCE + "; shown for Qwen2.5-Math",
                 (RANDOM, "base", "pass@1"), ">", margin=PASS_MARGIN,
                 note="the paper finds the effect model-dependent (absent in Llama3, OLMo2)"),
    common.Claim("... with a format-only reward", SOURCE, (FORMAT, "base", "pass@1"), ">",
                 margin=PASS_MARGIN),
    common.Claim("... and with an incorrect-label reward, negatively correlated with the "
                 "correct answer", SOURCE, (INCORRECT, "base", "pass@1"), ">",
                 margin=PASS_MARGIN),
    common.Claim("the spurious rewards' gains nearly match the ground-truth reward's",
                 SOURCE + "; tested on the random reward with a margin of 3 points",
                 (TRUE, RANDOM, "pass@1"), "=", margin=PASS_MARGIN),
    common.Claim("the random reward's gain comes from the clipping bias of the objective, "
                 "which favours the base's likely outputs", SOURCE + " (their analysis of "
                 "the mechanism)", None,
                 untestable="the main job takes one gradient step per batch: the ratio is 1 "
                            "and the clip never binds, so the bias the paper names does not "
                            "exist here; a design with several updates per batch "
                            "(updates_per_batch) could test it"),
)

STUDY = common.Study(
    name="spurious_rewards",
    question="does GRPO with a random, a format-only or an incorrect-answer reward still "
             "raise held-out pass@1 over the base, and how close to the ground-truth "
             "reward, paired by seed?",
    tiers=tiers.standard(
        full="about 40 min on 2 cores (estimated: 2 main bases of 1500 "
             "steps, shared with the other studies of the main base; 24 "
             "runs of the main job's GRPO stage on host rewards with two "
             "evaluations)"),
    arms=tuple(REWARDS),
    base_config=base_config,
    arm_configs=arm_configs,
    analyze=analyze,
    claims=CLAIMS,
)
