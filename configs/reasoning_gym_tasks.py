"""The main job on reasoning-gym generators (grpo_jax/tasks/reasoning_gym.py), on a CPU.

Pretrain a tiny character-level model on noisy worked solutions of the generators' problems,
evaluate it on held-out problems, run GRPO with the dataset's own scorer as the accuracy
reward, evaluate again. Needs the optional package: pip install -e ".[reasoning_gym]".

    python -m grpo_jax.main --config=configs/reasoning_gym_tasks.py:chain_sum \
        --workdir=runs/rg_chain_sum
    python -m grpo_jax.main --config=configs/reasoning_gym_tasks.py \
        --config.task.kwargs.datasets=chain_sum:2,spell_backward:1

Presets (after the colon), one per task family, each with small generator settings:
  chain_sum        (the default) arithmetic: sums of 2-3 one-digit terms with + and -
  letter_counting  counting: a letter's occurrences in 2 words of text
  spell_backward   string manipulation: a 3-5 letter word spelled backward
  smoke            seconds: chain_sum at tiny sizes, for tests
Every field, with its comment: grpo_jax/config_presets.py (`reasoning_gym_job`, `main_job`).
"""

import ml_collections

from grpo_jax.config_presets import reasoning_gym_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return reasoning_gym_job(preset)
