"""One run of the TRPO-against-PPO study (grpo_jax/studies/trpo_vs_ppo.py), from the base in
--config.model.init_from: the TRPO arm. The study itself: `python -m grpo_jax.studies run
trpo_vs_ppo`."""

from grpo_jax.studies.trpo_vs_ppo import TRPO, arm_config


def get_config(preset=None):
    del preset
    return arm_config(TRPO, "full")
