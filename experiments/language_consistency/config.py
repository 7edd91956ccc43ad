"""One run of the language-consistency study (grpo_jax/studies/language_consistency.py),
from the two-script base in --config.model.init_from, with the consistency reward. The study
itself: `python -m grpo_jax.studies run language_consistency`."""

from grpo_jax.studies.language_consistency import CONSISTENT, arm_config


def get_config(preset=None):
    del preset
    return arm_config(CONSISTENT, "full")
