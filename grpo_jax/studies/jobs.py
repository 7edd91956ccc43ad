"""Arm configs several studies build alike, over `configs`' builders: the main job's RL stage
alone from a base, and an RL stage scored on the host with an arm's own rewards."""

from __future__ import annotations

import ml_collections

from grpo_jax.studies.configs import main_job, preset


def rl_alone(tier: str):
    """The main job's RL stage alone (no pretraining, no evaluation stage), 60 steps of 16
    prompts at the full tier, from a base (model.init_from: the base's workdir, set by the
    study per base)."""
    config = main_job(preset(tier))
    config.stages = "rl"
    del config.pretrain, config.eval_base, config.eval_final
    if tier == "full":
        config.rl.steps = 60
        config.rl.num_prompts = 16
    config.model.init_from = ""
    return config


def host_rewards(config, rewards: dict):
    """`config` with its RL stage scoring `rewards` ({name: weight or section}) on the host
    (rl.fused_steps = 0)."""
    config.rl.fused_steps = 0
    config.rl.rewards = ml_collections.ConfigDict(rewards)
    return config
