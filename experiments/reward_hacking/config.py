"""One run of the reward-hacking study (grpo_jax/studies/reward_hacking.py), from the base in
--config.model.init_from: a reward model, then GRPO on its score. The study itself: `python
-m grpo_jax.studies run reward_hacking`."""

from grpo_jax.studies.reward_hacking import MODEL, arm_config


def get_config(preset=None):
    del preset
    return arm_config(MODEL, "full")
