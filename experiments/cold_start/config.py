"""One pipeline of the cold-start study (grpo_jax/studies/cold_start.py): `config.py:zero`
(R1-Zero) or `config.py:cold` (R1), from the base in --config.model.init_from. The study
itself: `python -m grpo_jax.studies run cold_start`."""

from grpo_jax.studies.cold_start import arm_config


def get_config(preset=None):
    return arm_config("full", preset)
