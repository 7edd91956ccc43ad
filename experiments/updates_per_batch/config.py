"""One run of the updates-per-batch study (grpo_jax/studies/updates_per_batch.py), from the
base in --config.model.init_from, with four clipped passes per batch. The study itself:
`python -m grpo_jax.studies run updates_per_batch`."""

from grpo_jax.studies.updates_per_batch import arm_config


def get_config(preset=None):
    del preset
    return arm_config("mu=4", "full")
