"""Agents: GRPO on multi-turn episodes against a stateful environment.

The task (grpo_jax/tasks/guess_number.py) is a hidden number in a range of 8 or 16; the
environment (grpo_jax/tools/games.py, `rl.tools=guess`) answers each `<guess>N</guess>`
with `<result>higher</result>` or `<result>lower</result>` and ends the episode, with reward
1, when a guess is the number. Pretraining traces bisect half the time and guess at random
otherwise, so the base follows the feedback only sometimes. `rl.tools=guess_blind` is the
same budget without the information (every wrong guess answered "no"); the env_feedback
study compares the two.

The "json" presets play the same game in the checkpoint convention: the guesses are JSON
function calls (`{"name": "guess", "arguments": {"number": "28"}}` between <tool_call>
tags) beside a sandboxed python tool (some worked solutions compute the middle of the range
with it), the tools are described by a chat template (task.chat_template=miniature), and the
environment answers in its <tool_response> turns (`rl.tools=json:guess,python`). Its
episodes are about five times longer in characters, so the CPU job learns slower.

    python -m grpo_jax.main --config=configs/agents.py            # the CPU job (tags)
    python -m grpo_jax.main --config=configs/agents.py:json       # JSON calls, python tool
    python -m grpo_jax.main --config=configs/agents.py:smoke      # the json job in seconds
    python -m grpo_jax.main --config=configs/agents.py --config.rl.tools=guess_blind

Every field: grpo_jax/config_presets.py (`agents_preset`, `agents_job`, `agents_json`).
"""

import ml_collections

from grpo_jax.config_presets import AGENTS_PRESETS as PRESETS  # noqa: F401  (tests)
from grpo_jax.config_presets import agents_preset


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return agents_preset(preset)
