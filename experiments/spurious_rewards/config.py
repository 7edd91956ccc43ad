"""One run of the spurious-rewards study (grpo_jax/studies/spurious_rewards.py), from the base
in --config.model.init_from, on the random reward. The study itself: `python -m
grpo_jax.studies run spurious_rewards`."""

from grpo_jax.studies.spurious_rewards import RANDOM, arm_config


def get_config(preset=None):
    del preset
    return arm_config(RANDOM, "full")
