"""One run of the forking-tokens study (grpo_jax/studies/forking_tokens.py), from the base in
--config.model.init_from; --config.rl.entropy_tokens=0.2 for the top-20% arm. The study
itself: `python -m grpo_jax.studies run forking_tokens`."""

from grpo_jax.studies.forking_tokens import TOP, arm_config


def get_config(preset=None):
    del preset
    return arm_config(TOP, "full")
