"""One run of the PPO-against-GRPO study (grpo_jax/studies/ppo_vs_grpo.py), from the base in
--config.model.init_from: the PPO arm. The study itself: `python -m grpo_jax.studies run
ppo_vs_grpo`."""

from grpo_jax.studies.ppo_vs_grpo import PPO, arm_config


def get_config(preset=None):
    del preset
    return arm_config(PPO, "full")
