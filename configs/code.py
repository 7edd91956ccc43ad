"""Code: GRPO on a miniature program-synthesis task with unit-test rewards.

The task (grpo_jax/tasks/code_expression.py) shows three values of a hidden function,
"f(1)=5 f(2)=7 f(4)=11"; the answer is a Python expression in x (`<answer>2*x+3</answer>`).
The reward "tests" is the fraction of six hidden tests the expression passes, each answer run
in its own sandbox process (grpo_jax/tools/sandbox.py), never in the trainer.

    python -m grpo_jax.main --config=configs/code.py            # the CPU job
    python -m grpo_jax.main --config=configs/code.py:smoke      # seconds, real gradients

Every field: grpo_jax/config_presets.py (`code_job`).
"""

import ml_collections

from grpo_jax.config_presets import code_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return code_job(preset)
