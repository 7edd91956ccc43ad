"""One run of the expert-iteration study (grpo_jax/studies/expert_iteration.py), from the
base in --config.model.init_from: four rounds of rejection-sampling SFT. The study itself:
`python -m grpo_jax.studies run expert_iteration`."""

from grpo_jax.studies.expert_iteration import EI, arm_config


def get_config(preset=None):
    del preset
    return arm_config(EI, "full")
