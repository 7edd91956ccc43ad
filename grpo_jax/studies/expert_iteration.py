"""Expert iteration against GRPO at equal samples: is filtered SFT on the policy's own verified
samples as good as the policy gradient?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; seeds 0 and 1), two arms that draw the same number of samples from their
own current policy (7,680: 60 x 128):

* `GRPO`: the main job's GRPO stage at 60 steps of 16 prompts x 8 completions (the main
  job itself runs 80 x 32 x 8);
* `expert iteration`: four rounds of rejection-sampling SFT (`rejection_sft`), each sampling
  8 completions of 240 training problems from the current policy (1,920 samples), keeping
  the verified-correct, well-formed, distinct ones, and fine-tuning on them for 15 steps of
  32 (60 optimizer steps in all, the stage's default learning rate 1e-3).
"""

from __future__ import annotations

from grpo_jax.metrics import read_metrics
from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

GRPO, EI = "GRPO", "expert iteration"
ROUNDS, PROBLEMS, SAMPLES, SFT_STEPS = 4, 240, 8, 15
GRPO_STEPS, GRPO_PROMPTS = 60, 16  # x 8 completions: 7,680 samples, as the four rounds draw
METRICS = ("pass@1", "pass@8", "format_rate")
PASS_MARGIN = 0.03
SPECS = [(EI, GRPO, "pass@1"), (EI, "base", "pass@1"), (GRPO, "base", "pass@1"),
         (EI, GRPO, "pass@8")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from, evaluated before and after."""
    from grpo_jax.stages import default_section

    config = common.main_arm(tier, "")  # its stages below
    if arm == GRPO:
        config.stages = "eval_base,rl,eval_final"
        if tier == "full":  # the design's 7,680 samples (the main job's own stage: 20,480)
            config.rl.steps, config.rl.num_prompts = GRPO_STEPS, GRPO_PROMPTS
        return config
    rounds = []
    problems, steps, batch = (PROBLEMS, SFT_STEPS, 32) if tier == "full" else (8, 1, 8)
    for index in range(ROUNDS):
        name = f"ei{index + 1}"
        config[name] = default_section("rejection_sft")
        config[name].update(num_problems=problems, num_samples=SAMPLES, steps=steps,
                            batch_size=batch, max_new_tokens=config.rl.max_new_tokens)
        rounds.append(name)
    config.stages = ",".join(["eval_base", *rounds, "eval_final"])
    del config.rl
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in (GRPO, EI)}


def _values(record) -> dict:
    values = common.eval_values(record, METRICS)
    kept = [r["kept"] for r in read_metrics(record.workdir)
            if r.get("kept") is not None]  # each round's selection line
    values["kept"] = sum(kept) if kept else None
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, (GRPO, EI))
    common.add_base_arm(arms, GRPO, METRICS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.bar_plots(arms, (tables.PASS_AT_1, tables.PASS_AT_8)))


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, ("base", GRPO, EI),
        ("pass@1", "pass@8", "format rate", "samples kept and trained on"),
        tables.metric_row("pass@1", "pass@8", "format_rate", ("kept", 1.0, 0)),
        "In %, mean ± 95% half-width over (base, seed) runs; 128 held-out problems x 8 "
        "samples. Both arms sample 7,680 completions from their own current policy.")


SOURCE = ("Havrilla et al. 2024, \"Teaching Large Language Models to Reason with "
          "Reinforcement Learning\", arXiv:2403.04642, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("expert iteration performs comparably to (or better than) the policy "
                 "gradient methods at a similar sample budget", SOURCE + "; their RL is PPO, "
                 "here GRPO", (EI, GRPO, "pass@1"), "=", margin=PASS_MARGIN),
    common.Claim("RL fine-tuning improves maj@1 without improving pass@n much beyond "
                 "supervised fine-tuning", SOURCE + "; tested at n = 8 as expert iteration "
                 "against GRPO", (EI, GRPO, "pass@8"), "=", margin=PASS_MARGIN,
                 note="8 samples per problem: pass@8 on this task is near its ceiling"),
)

STUDY = common.Study(
    name="expert_iteration",
    question="does expert iteration (four rounds of SFT on the policy's own verified samples) "
             "match GRPO at the same 7,680 samples, paired by seed?",
    tiers=tiers.standard(
        full="about 10 min on 2 cores (measured: 610 s beside another "
             "study process, the 2 main bases already built (shared "
             "with the other studies of the main base); 12 runs)"),
    arms=(GRPO, EI), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
