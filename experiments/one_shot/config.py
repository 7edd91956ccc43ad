"""One run of the one-shot study (grpo_jax/studies/one_shot.py), from the base in
--config.model.init_from, on one training problem: position --config.task.train_pick of the
candidate pool (the first 128 training problems of seed 0). The study picks the position per
base by the historical variance score of a prior run: `python -m grpo_jax.studies run
one_shot` (its summary.json's extra.selection names it)."""

from grpo_jax.studies.one_shot import ONE, arm_config


def get_config(preset=None):
    del preset
    config = arm_config(ONE, "full")
    config.task.train_pick = (0,)
    return config
