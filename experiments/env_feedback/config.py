"""One run of the environment-feedback study (grpo_jax/studies/env_feedback.py), from the base
in --config.model.init_from; --config.rl.tools=guess_blind for the blind arm. The study
itself: `python -m grpo_jax.studies run env_feedback`."""

from grpo_jax.studies.env_feedback import FEEDBACK, arm_config


def get_config(preset=None):
    del preset
    return arm_config(FEEDBACK, "full")
