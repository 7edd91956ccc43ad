"""One run of the one-shot study (grpo_jax/studies/one_shot.py), from the base in
--config.model.init_from, on one training problem. The study itself: `python -m
grpo_jax.studies run one_shot`."""

from grpo_jax.studies.one_shot import ONE, arm_config


def get_config(preset=None):
    del preset
    return arm_config(ONE, "full")
