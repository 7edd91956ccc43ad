"""Does RL against a learned reward model raise the model's score while true accuracy falls?

From the main base (configs/default.py's pretraining, 1500 steps; the full tier's base seeds,
`tiers.FULL_BASES`), every run first trains a Bradley-Terry reward model from the base
(`reward_model` stage: 512 pairs of a correct and an incorrect worked solution, 100 steps),
then runs the main job's GRPO stage with one of two rewards:

* `rule`: accuracy + 0.2 x format (the main job's rule reward; the reward model's score
  logged with weight 0);
* `reward model`: the reward model's score alone (accuracy and format logged with weight 0).

Measured: held-out pass@1 after RL, and over the training rollouts the reward model's score
and the true accuracy: their change from the first step to the mean of the last 10
(`rm_gain`, `accuracy_gain`) and the gap between them at the end. The pseudo-arm
`no change` holds 0 for both gains.
"""

from __future__ import annotations

import math

from grpo_jax.studies import common, jobs, tables, tiers
from grpo_jax.studies.arms import per_arm

RULE, MODEL, ZERO = "rule", "reward model", "no change"
REWARDS = {RULE: {"accuracy": 1.0, "format": 0.2, "reward_model": 0.0},
           MODEL: {"reward_model": 1.0, "accuracy": 0.0, "format": 0.0}}
METRICS = ("pass@1", "format_rate")
PASS_MARGIN = 0.03
SPECS = [(MODEL, ZERO, "rm_gain"), (MODEL, ZERO, "accuracy_gain"), (MODEL, RULE, "pass@1"),
         (RULE, ZERO, "rm_gain")]
# The mini tier runs the reward-model arm alone, against the `no change` pseudo-arm: the rule
# arm trains and logs the same reward model and scores as the other studies' runs do; its
# contrasts are the same code.


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the reward model, the held-out
    evaluation, GRPO on the arm's reward, the evaluation again."""
    from grpo_jax.stages import default_section

    config = common.main_arm(tier, "")  # its stages below
    config.rm = default_section("reward_model")
    if tier != "full":
        config.rm.update(num_pairs=16, eval_pairs=8, steps=2, batch_size=8)
    config.stages = "rm,eval_base,rl,eval_final"
    config.rl.reward_model = "rm"
    return jobs.host_rewards(config, REWARDS[arm])  # the reward model scores on the host


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in REWARDS}


def _gain(rows: list[dict], name: str) -> float | None:
    series = [r.get(name) for r in rows]
    series = [v for v in series if v is not None and math.isfinite(v)]
    if len(series) < 2:
        return None
    last = series[-10:]
    return sum(last) / len(last) - series[0]


def _values(record) -> dict:
    values = common.eval_values(record, METRICS)
    rows = [r for r in common.training_rows(record) if r.get("stage", "rl") == "rl"]
    values["rm_gain"] = _gain(rows, "reward/reward_model")
    values["accuracy_gain"] = _gain(rows, "reward/accuracy")
    last = rows[-10:]
    scores = [r.get("reward/reward_model") for r in last if r.get("reward/reward_model")
              is not None]
    accuracy = [r.get("reward/accuracy") for r in last if r.get("reward/accuracy") is not None]
    values["rm_score_last10"] = sum(scores) / len(scores) if scores else None
    values["accuracy_last10"] = sum(accuracy) / len(accuracy) if accuracy else None
    rm_rows = common.last_stage_rows(record).get("rm", {})
    values["rm_pair_accuracy"] = rm_rows.get("eval_pair_accuracy", rm_rows.get("pair_accuracy"))
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, REWARDS)
    common.add_base_arm(arms, RULE, METRICS)
    for metric in ("rm_gain", "accuracy_gain"):
        common.constant_arm(arms, MODEL, ZERO, metric, 0.0)
    panels = (("reward/reward_model", "reward model score"),
              ("reward/accuracy", "true accuracy (training)"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.curve_plots(runs, REWARDS, panels))


def table(arms: dict) -> str:
    def row(m):
        cell = tables.optional_cells(m)
        return [cell("pass@1"), f"{cell('rm_score_last10', 1.0, 3)} ({cell('rm_gain', 1.0, 3)})",
                f"{cell('accuracy_last10')} ({cell('accuracy_gain')})", cell("rm_pair_accuracy")]

    return tables.arm_table(
        arms, ("base", *REWARDS),
        ("pass@1", "RM score, last 10 steps (change)",
         "training accuracy, last 10 steps (change)", "RM pair accuracy"), row,
        "pass@1 and accuracies in %, the reward model's score in its own units; mean ± 95% "
        "half-width over (base, seed) runs. A change is the mean of the last 10 training steps "
        "minus the first step.")


SOURCE = ("DeepSeek-AI 2025, \"DeepSeek-R1\", arXiv:2501.12948, sec. 2.2.2 (close "
          "paraphrase)")
CLAIMS = (
    common.Claim("a neural reward model may suffer from reward hacking in large-scale RL: its "
                 "score rises", SOURCE + "; R1's reason to use rule rewards",
                 (MODEL, ZERO, "rm_gain"), ">", margin=0.1, kind="check",
                 can_fail="no: RL maximises this score, so it rises under it (it rises under "
                          "the rule reward too); the claim's substance is the next one",
                 note=common.POST_HOC_MARGIN),
    common.Claim("... while what it stands for, the true accuracy, does not", SOURCE +
                 "; tested as the training accuracy under RL on the reward model rising "
                 "less than 3 points (one-sided)",
                 (MODEL, ZERO, "accuracy_gain"), "<=", margin=0.03,
                 why="the reward model learns from the base to rank a clean worked solution "
                     "above one whose every step confuses an operator, the very errors the "
                     "base samples: while the policy stays near those traces, raising the "
                     "score removes confusions and the true accuracy rises with it, and the "
                     "80-step stage may end before the policy finds what the score pays "
                     "beyond right steps, so the change from the first step can reach the "
                     "margin"),
    common.Claim("rule rewards train a better policy than the neural reward model",
                 SOURCE + "; tested as held-out pass@1", (MODEL, RULE, "pass@1"), "<",
                 margin=PASS_MARGIN,
                 why="where the reward model's score tracks the operator confusions the "
                     "base samples, GRPO on it sharpens towards right answers about as fast "
                     "as on the rule reward (its graded score even ranks completions the "
                     "rule scores alike), so the rule arm can lead by less than the margin; "
                     "a score exploited within the 80 steps lowers pass@1 only where the "
                     "policy ends on outputs the model overrates"),
)

STUDY = common.Study(
    name="reward_hacking",
    question="does GRPO against a learned reward model raise the model's score while true "
             "accuracy falls, against the rule reward, paired by seed?",
    tiers=tiers.standard(
        full="about 70 min on 2 cores (measured: 4253 s beside another "
             "study process, the 2 main bases already built (shared with "
             "the other studies of the main base); 12 runs of about 6 "
             "min, each with its reward model)",
        mini="about 17 s of CPU on 2 cores, measured (16-17 s for its test alone, which "
             "compiles every program itself): one toy base, one seed of the reward-model arm",
        mini_arms=(MODEL,)),
    arms=tuple(REWARDS), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
