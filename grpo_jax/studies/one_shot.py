"""How few training problems does GRPO need: RL on 1, 4 and 16 problems against the full set?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; seeds 0 and 1), four arms of the same GRPO stage (80 steps, 32 prompts x
8 completions) that differ only in the training problems the prompts are drawn from
(`task.train_size`; the held-out problems are the same 128 for every arm):

* `1 problem`, `4 problems`, `16 problems`: every prompt of every step is one of them;
* `full set`: 20,000 problems (the main job's).

The problems of a smaller set are the first of the full set's seeded order, so `1 problem`
is in `4 problems` and so on, for a given seed.
"""

from __future__ import annotations

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

SIZES = {"1 problem": 1, "4 problems": 4, "16 problems": 16, "full set": 20000}
ONE, FULL = "1 problem", "full set"
METRICS = ("pass@1", "pass@8", "format_rate")
PASS_MARGIN = 0.03

SPECS = [(ONE, "base", "pass@1"), (ONE, FULL, "pass@1"), ("16 problems", FULL, "pass@1"),
         ("4 problems", FULL, "pass@1"), (FULL, "base", "pass@1")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the held-out evaluation, the main
    job's GRPO stage on the arm's training problems, the evaluation again."""
    config = common.main_arm(tier, "eval_base,rl,eval_final")
    config.task.train_size = SIZES[arm]
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in SIZES}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, lambda r: common.eval_values(r, METRICS), SIZES)
    common.add_base_arm(arms, FULL, METRICS)
    panels = (("reward_mean", "training reward"), ("reward_std", "reward std within groups"))
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
                           plots=tables.curve_plots(runs, SIZES, panels))


def table(arms: dict, config) -> str:
    return tables.arm_table(
        arms, ("base", *SIZES), ("pass@1", "pass@8", "format rate"),
        tables.metric_row("pass@1", "pass@8", "format_rate"),
        f"In %, mean ± 95% half-width over (base, seed) runs, on {tables.rl_caption(config)} "
        "(the base: before).")


SOURCE = ("Wang et al. 2025, \"Reinforcement Learning for Reasoning in Large Language Models "
          "with One Training Example\", arXiv:2504.20571, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("RLVR with one training example raises held-out performance substantially",
                 SOURCE, (ONE, "base", "pass@1"), ">", margin=PASS_MARGIN),
    common.Claim("1-shot RLVR performs comparably to RLVR on a large training set", SOURCE +
                 "; their comparison set is 1.2k problems; here the full 20,000",
                 (ONE, FULL, "pass@1"), "=", margin=PASS_MARGIN),
    common.Claim("test performance keeps improving after the training accuracy on the one "
                 "example saturates (post-saturation generalization)", SOURCE, None,
                 untestable="the held-out problems are evaluated once, after the 80 steps; "
                            "a curve would need evaluations during the stage"),
)

STUDY = common.Study(
    name="one_shot",
    question="does GRPO on 1, 4 or 16 training problems raise held-out pass@1 as much as on "
             "the full 20,000, paired by seed?",
    tiers=tiers.standard(
        full="about an hour on 2 cores (measured: 61 min beside "
             "another study process and the test suite; the 2 main bases "
             "shared with the other studies of the main base; 24 runs of "
             "the main job's GRPO stage with two evaluations)",
        mini="seconds on 2 cores: one toy base, one seed, "
             "a subset of the arms",
        mini_arms=(ONE, FULL)),
    arms=tuple(SIZES), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
