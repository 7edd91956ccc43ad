"""One run of the off-policy study (grpo_jax/studies/off_policy.py): K = 0 unless
--config.rl.max_staleness / --config.rl.off_policy_correction say otherwise, from the base in
--config.model.init_from. The study itself: `python -m grpo_jax.studies run off_policy`."""

from grpo_jax.studies.off_policy import arm_config


def get_config(preset=None):
    del preset
    return arm_config("full")
