"""The DeepSeek-R1 recipe in miniature (https://arxiv.org/abs/2501.12948, sec. 2.3).

cold-start SFT on clean worked solutions -> eval -> reasoning RL (GRPO) with accuracy, format
and language-consistency rewards -> rejection-sampling SFT on verified samples of the RL
policy (mixed with clean solutions) -> final RL -> eval; the same report as the main job.

    python -m grpo_jax.main --config=configs/r1_pipeline.py
    python -m grpo_jax.main --config=configs/r1_pipeline.py:smoke   # under a minute on CPU

The "language" reward is not a task reward: reward names resolve to the task's rewards, then
the stage kinds' reward sources, then grpo_jax.rewards' built-ins (grpo_jax/runner/rewards.py).

Every field: grpo_jax/config_presets.py (`r1_pipeline_job`); `--config=r1_pipeline[:preset]` runs it from any
folder.
"""

import ml_collections

from grpo_jax.config_presets import r1_pipeline_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return r1_pipeline_job(preset)
