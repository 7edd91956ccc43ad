"""The main job with PPO (a critic, GAE, per-token KL reward) instead of GRPO.

pretrain -> eval_base -> ppo -> eval_final on the arithmetic task, as configs/default.py.
The job's fields, with their comments: grpo_jax/config_presets.py (`ppo_job`,
`with_ppo`); every field of the ppo section: grpo_jax/stages/ppo.py.

    python -m grpo_jax.main --config=configs/ppo.py
    python -m grpo_jax.main --config=configs/ppo.py:smoke   # seconds on CPU
    python -m grpo_jax.main --config=configs/ppo.py --config.ppo.adaptive_kl=True
"""

import ml_collections

from grpo_jax.config_presets import ppo_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return ppo_job(preset)
