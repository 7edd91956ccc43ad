"""Registers the PPO, TRPO, reward-model and R1 stage kinds (imported by grpo_jax.stages).

Stage kinds: "ppo" (grpo_jax.rl.ppo), "trpo" (grpo_jax.rl.trpo), "reward_model"
(grpo_jax.rl.reward_model), "rejection_sft" and "distill" (grpo_jax.r1).
`validate(name, section, config)` checks one section of any of these kinds.
"""

from __future__ import annotations

from grpo_jax import r1
from grpo_jax.pipeline import register_stage
from grpo_jax.rl import ppo, reward_model, trpo

# Kinds whose metrics are RL curves (reward_mean, pass@1, kl, ...) for the run report.
RL_STAGE_KINDS = ("rl", "ppo", "trpo")

register_stage("ppo")(ppo.ppo_stage)
register_stage("trpo")(trpo.trpo_stage)
register_stage("reward_model")(reward_model.reward_model_stage)
register_stage("rejection_sft")(r1.rejection_sft_stage)
register_stage("distill")(r1.distill_stage)

# "ppo" and "trpo" are stage kinds with their own loops, not rl.algorithm names: registering
# them in grpo_jax.rl.algorithms would let rl.algorithm=ppo pass validation and then fail in
# compute_advantages, so they are deliberately not registered there.

VALIDATORS = {
    "ppo": ppo.validate_section,
    "trpo": trpo.validate_section,
    "reward_model": reward_model.validate_section,
    "rejection_sft": r1.validate_section,
    "distill": r1.validate_section,
}


def validate(name: str, section, config) -> None:
    """Checks the section `name` of one of this module's kinds; ValueError names the field."""
    if section.kind in VALIDATORS:
        VALIDATORS[section.kind](name, section, config)


def run_single_stage(config, name: str, workdir: str):
    """Runs the one stage `name` of `config` in `workdir` (no resume, no run report)."""
    from grpo_jax.pipeline import STAGE_KINDS, Run, StageSpec

    validate(name, config[name], config)
    run = Run(config, str(workdir))
    try:
        STAGE_KINDS[config[name].kind](run, StageSpec(0, name, config[name], None))
    finally:
        run.close()
    return run
