"""One run of the tool-use study (grpo_jax/studies/tool_use.py), from the base in
--config.model.init_from. The study itself: `python -m grpo_jax.studies run tool_use`."""

from grpo_jax.studies.tool_use import arm_config


def get_config(preset=None):
    del preset
    return arm_config("full")
