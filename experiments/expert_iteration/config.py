"""One run of the expert-iteration study (grpo_jax/studies/expert_iteration.py), from the
base in --config.model.init_from: four rounds of rejection-sampling SFT with the grid's recipe
`EI lr 1e-3 x 15` (the others: --config.ei1.lr ... --config.ei4.steps). The study runs the
whole grid and chooses among it on a validation split: `python -m grpo_jax.studies run
expert_iteration`."""

from grpo_jax.studies.expert_iteration import arm_config


def get_config(preset=None):
    del preset
    return arm_config("EI lr 1e-3 x 15", "full")
