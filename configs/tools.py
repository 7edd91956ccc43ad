"""Tool calls as environment state: GRPO on multi-turn episodes with a calculator.

The task (grpo_jax/tasks/tool_arithmetic.py) is "a op b" with 3-5 digit operands (3-4
here), which a tiny model cannot compute in its head. Its pretraining data call the
calculator in most of the worked solutions (`<calc>4821*367</calc><result>1769307</result>`)
and copy the result into the answer, with noise. RL samples multi-turn episodes
(`rl.tools=calc`): a turn ends at `</calc>`, the calculator's answer is appended as an
observation (attended to, never trained on), and the policy continues from its KV cache.
Evaluation runs with and without the tool, before and after RL.

    python -m grpo_jax.main --config=configs/tools.py            # the CPU job
    python -m grpo_jax.main --config=configs/tools.py:smoke      # seconds, real gradients
    python -m grpo_jax.main --config=configs/tools.py --config.rl.algorithm=dr_grpo

experiments/tool_use/ runs it over seeds and reports the paired differences. Every field:
grpo_jax/config_presets.py (`tool_job`).
"""

import ml_collections

from grpo_jax.config_presets import EVALS, tool_job  # noqa: F401  (EVALS: tests)


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    return tool_job(preset)
