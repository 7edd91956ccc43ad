"""The main job with TRPO (natural-gradient steps in a KL trust region) instead of GRPO.

pretrain -> eval_base -> trpo -> eval_final on the arithmetic task, as configs/default.py.
One TRPO step per rollout batch on group-normalised advantages; the exact KL over the
vocabulary makes it a small-model algorithm. The job's fields, with their comments:
grpo_jax/config_presets.py (`trpo_job`, `with_trpo`); every field of the trpo section:
grpo_jax/stages/trpo.py.

    python -m grpo_jax.main --config=configs/trpo.py
    python -m grpo_jax.main --config=configs/trpo.py:smoke   # seconds on CPU
    python -m grpo_jax.main --config=configs/trpo.py --config.trpo.max_kl=0.02
"""

import ml_collections

from grpo_jax.config_presets import trpo_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return trpo_job(preset)
