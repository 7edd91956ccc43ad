"""One arm of the length-bias study (grpo_jax/studies/length_bias.py): `config.py:grpo`,
`config.py:grpo_no_len_norm`, `config.py:grpo_no_std` or `config.py:dr_grpo`, from the base
in --config.model.init_from (the main job's pretraining with task.kwargs.redo_rate 0.3). The
study itself: `python -m grpo_jax.studies run length_bias`."""

from grpo_jax.studies.length_bias import arm_config


def get_config(preset=None):
    return arm_config("full", preset or "grpo")
