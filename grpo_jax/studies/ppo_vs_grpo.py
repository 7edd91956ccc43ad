"""PPO with a critic against GRPO at equal samples, and GRPO's group size.

From the main base (configs/default.py's pretraining, 1500 steps; the full tier's base seeds,
`tiers.FULL_BASES`), arms that each sample 80 batches of 256 completions (20,480):

* `PPO`: configs/ppo.py's stage (a critic initialised from the policy, GAE, a per-token KL
  reward, 2 epochs x 2 minibatches per batch), on 256 prompts x 1 completion;
* `GRPO G=2`, `G=4`, `G=8`, `G=16`: the main job's GRPO stage on 256 / G prompts x G
  completions (G = 8 is the main job).

Measured per run: held-out pass@1, and per training step the seconds of sampling and of the
update (means over the steps; the runs of a study run one after another in one process).
"""

from __future__ import annotations

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm, training_means

PPO = "PPO"
GROUPS = {"GRPO G=2": 2, "GRPO G=4": 4, "GRPO G=8": 8, "GRPO G=16": 16}
MAIN = "GRPO G=8"
ARMS = (PPO, *GROUPS)
METRICS = ("pass@1", "format_rate")
TIMES = ("sample_time_s", "update_time_s", "step_time_s")
PASS_MARGIN = 0.03
SPECS = [(MAIN, PPO, "pass@1"), (MAIN, PPO, "update_time_s"), ("GRPO G=16", "GRPO G=2", "pass@1"),
         ("GRPO G=4", "GRPO G=2", "pass@1"), (PPO, "base", "pass@1")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from, evaluated before and after: GRPO with
    group size G on the main job's samples per step, or the PPO stage on the same samples
    per step (`config_presets.with_ppo`: configs/ppo.py's stage at 4x its prompts)."""
    from grpo_jax import config_presets

    config = common.main_arm(tier, "eval_base,rl,eval_final")
    if arm not in GROUPS:
        return config_presets.with_ppo(config)
    samples = config.rl.num_prompts * config.rl.group_size
    config.rl.fused_steps = 0  # the host loop for every arm, as PPO runs
    config.rl.group_size = GROUPS[arm]
    config.rl.num_prompts = max(samples // GROUPS[arm], 1)
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _values(record) -> dict:
    # the first step compiles
    return {**common.eval_values(record, METRICS), **training_means(record, TIMES, skip=1)}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, MAIN, METRICS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.bar_plots(arms, (
                               tables.PASS_AT_1,
                               ("update_time_s", "update seconds per step", 1.0))))


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS), ("pass@1", "format rate", "sampling s/step", "update s/step"),
        tables.metric_row("pass@1", "format_rate", ("sample_time_s", 1.0, 3),
                          ("update_time_s", 1.0, 3)),
        "pass@1 and format in %, seconds per training step (the first, compiling, left out); "
        "mean ± 95% half-width over (base, seed) runs. By construction PPO holds seven "
        "parameter-sized buffers (policy, critic, reference, Adam's two moments for policy and "
        "critic), GRPO with a KL term four (policy, reference, two moments).")


SOURCE = ("Shao et al. 2024, \"DeepSeekMath: Pushing the Limits of Mathematical Reasoning in "
          "Open Language Models\", arXiv:2402.03300, sec. 4.1 (close paraphrase)")
CLAIMS = (
    common.Claim("GRPO foregoes the critic model, estimating the baseline from group scores, "
                 "significantly reducing training resources", SOURCE + "; tested as the "
                 "update's seconds per step, GRPO G=8 against PPO at the same samples",
                 (MAIN, PPO, "update_time_s"), "<", margin=0.75,
                 why="the margin is absolute seconds: on a 1M-parameter model a pass over "
                     "a batch of 256 short completions takes a fraction of a second, so "
                     "PPO's extra work (two epochs over the batch where GRPO takes one pass, "
                     "and as many passes of the critic) may add less than 0.75 s a step; "
                     "and the seconds are measured while another study process shares the "
                     "two cores, whose load can differ between the arms' runs",
                 note=common.POST_HOC_MARGIN + " (a tenth of PPO's update time); PPO as configs/ppo.py runs it: 2 epochs x 2 minibatches per batch, so "
                      "part of the cost is its four optimizer steps"),
    common.Claim("GRPO is as effective as PPO without the value function", SOURCE + "; a "
                 "reading of sec. 4.1, not a quoted result; tested as held-out pass@1 within "
                 "3 points", (MAIN, PPO, "pass@1"), "=", margin=PASS_MARGIN,
                 why="the arms differ in more than the critic: PPO takes four optimizer "
                     "steps per batch on one completion of each of 256 prompts, GRPO one "
                     "step on 8 completions of each of 32, and PPO's critic, initialised "
                     "from the policy, must learn values from one outcome reward per "
                     "completion before its baseline beats a constant: the two can sharpen "
                     "the base at different rates over the 80 batches and end more than "
                     "the margin apart either way"),
)

STUDY = common.Study(
    name="ppo_vs_grpo",
    question="does GRPO (G in 2, 4, 8, 16) match PPO with a critic at the same 20,480 samples, "
             "and at what cost per step, paired by seed?",
    tiers=tiers.standard(
        full="about 2 hours on 2 cores (measured: 7404 s beside another "
             "study process, the 2 main bases already built; 30 runs: "
             "PPO's about 11 min each, GRPO's about 3 min, G=8's six "
             "shared with updates_per_batch's mu=1)",
        mini="about 20 s of CPU on 2 cores, measured (18-19 s for its test alone, which "
             "compiles every program itself): one toy base, one seed of PPO and GRPO G=8",
        mini_arms=(PPO, MAIN)),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, claims=CLAIMS,
)
