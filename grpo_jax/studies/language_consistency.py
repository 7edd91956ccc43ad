"""Does RL without a language-consistency reward mix scripts in its reasoning, and does R1's
consistency reward remove the mixing at a cost in accuracy?

The two-script task: the main job's arithmetic with each step introduced by a word ("first",
"then"), written in Greek in 30% of the noisy worked solutions (`mixed_script_rate` 0.3), so
the base mixes the two scripts in its thinking. From that base (1500 pretraining steps; seeds
0 and 1), two arms of the main job's GRPO stage:

* `accuracy`: accuracy + 0.2 x format (the language reward logged with weight 0);
* `with consistency`: the same plus R1's language-consistency reward (the share of English
  words in the thinking, `rewards.language`) summed with weight 1, as R1 sums it.

Both score on the host (`rl.fused_steps = 0`). Measured on the held-out problems before and
after: pass@1 and the mean language consistency of the completions (`reward/language`).
"""

from __future__ import annotations

from grpo_jax.studies import common, jobs, tables, tiers
from grpo_jax.studies.arms import per_arm

ACCURACY, CONSISTENT = "accuracy", "with consistency"
REWARDS = {ACCURACY: {"accuracy": 1.0, "format": 0.2, "language": 0.0},
           CONSISTENT: {"accuracy": 1.0, "format": 0.2, "language": 1.0}}
MIXED_SCRIPT_RATE = 0.3
METRICS = ("pass@1", "reward/language", "format_rate")
SPECS = [(CONSISTENT, ACCURACY, "reward/language"), (CONSISTENT, ACCURACY, "pass@1"),
         (ACCURACY, "base", "reward/language"), (ACCURACY, "base", "pass@1")]


def _two_scripts(config):
    config.task.kwargs.mixed_script_rate = MIXED_SCRIPT_RATE
    return config


def base_config(tier: str):
    """The main job's pretraining on the two-script traces (1500 steps; the smoke preset's 3
    at the mini tier)."""
    return _two_scripts(common.main_base(tier))


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from, evaluated before and after."""
    config = _two_scripts(common.main_arm(tier, "eval_base,rl,eval_final"))
    return jobs.host_rewards(config, REWARDS[arm])  # the language reward is scored on the host


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in REWARDS}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, lambda r: common.eval_values(r, METRICS), REWARDS)
    common.add_base_arm(arms, ACCURACY, METRICS)
    panels = (("reward/accuracy", "training accuracy"),
              ("reward/language", "language consistency"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.curve_plots(runs, REWARDS, panels))


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, ("base", *REWARDS), ("pass@1", "language consistency", "format rate"),
        tables.metric_row("pass@1", "reward/language", "format_rate"),
        "In %, mean ± 95% half-width over (base, seed) runs; language consistency is the mean "
        "share of English step words in the thinking of the held-out completions (1 without "
        "any step word).")


SOURCE = ("DeepSeek-AI 2025, \"DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via "
          "Reinforcement Learning\", arXiv:2501.12948, sec. 2.3.2 (close paraphrase)")
CLAIMS = (
    common.Claim("a language consistency reward during RL mitigates language mixing",
                 SOURCE, (CONSISTENT, ACCURACY, "reward/language"), ">", margin=0.03,
                kind="check", can_fail="no: RL maximises this reward, so its share rises "
                                       "under it; the claim's cost is the next one"),
    common.Claim("such alignment results in a slight degradation in the model's performance",
                 SOURCE + " (its ablation)", (CONSISTENT, ACCURACY, "pass@1"), "<",
                 margin=0.005,
                 why="each step word's script is drawn apart from whether the step is right, "
                     "so the consistency term costs accuracy only by sharing one advantage "
                     "with it: its spread within a group, which says nothing of correctness, "
                     "dilutes the accuracy signal without turning it, and may cost less than "
                     "the half-point margin or nothing",
                 note="a half-point margin: the claim is of a slight cost"),
    common.Claim("the chain of thought often exhibits language mixing under RL without it",
                 SOURCE + "; tested as RL without the reward lowering the base's consistency",
                 (ACCURACY, "base", "reward/language"), "<", margin=0.03,
                 why="with the language reward at weight zero nothing the accuracy arm is "
                     "paid for depends on the script, which is drawn apart from correctness, "
                     "so GRPO has no push towards Greek: the share can drift either way, and "
                     "sharpening that spills over onto the step words favours the likelier "
                     "English one (70% of the pretraining traces' words), raising "
                     "consistency instead",
                 note="R1's mixing arises with prompts in several languages; here the prompts "
                      "are in one and the mixing is the base's"),
)

STUDY = common.Study(
    name="language_consistency",
    question="on the two-script task, does GRPO without a consistency reward mix scripts, "
             "and does R1's language-consistency reward remove the mixing at a cost in "
             "pass@1, paired by seed?",
    tiers=tiers.standard(
        full="about 60 min on 2 cores (measured: 3661 s, mostly beside "
             "other processes: 2 two-script bases of 1500 steps, about 13 "
             "min each, and 12 runs on host rewards of about 3 min)"),
    arms=tuple(REWARDS), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
