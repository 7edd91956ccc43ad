"""Agents: GRPO on multi-turn episodes against a stateful environment.

The task (grpo_jax/tasks/guess_number.py) is a hidden number in a range of 8 or 16; the
environment (grpo_jax/tools/games.py, `rl.tools=guess`) answers each `<guess>N</guess>`
with `<result>higher</result>` or `<result>lower</result>` and ends the episode, with reward
1, when a guess is the number. Pretraining traces bisect half the time and guess at random
otherwise, so the base follows the feedback only sometimes. `rl.tools=guess_blind` is the
same budget without the information (every wrong guess answered "no").

    python -m grpo_jax.main --config=configs/agents.py            # the CPU job
    python -m grpo_jax.main --config=configs/agents.py:smoke      # seconds, real gradients
    python -m grpo_jax.main --config=configs/agents.py --config.rl.tools=guess_blind

Every field: grpo_jax/config_presets.py (`agents_job`).
"""

import ml_collections

from grpo_jax.config_presets import agents_job


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return agents_job(preset)
