"""One run of the update-sparsity study (grpo_jax/studies/update_sparsity.py), from the base
in --config.model.init_from: the SFT arm. The study itself: `python -m grpo_jax.studies run
update_sparsity`."""

from grpo_jax.studies.update_sparsity import SFT, arm_config


def get_config(preset=None):
    del preset
    return arm_config(SFT, "full")
