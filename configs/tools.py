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

experiments/tool_use/ runs it over seeds and reports the paired differences.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import default  # noqa: E402

EVALS = ("eval_base", "eval_base_no_tool", "eval_final", "eval_final_no_tool")


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    if preset not in (None, "", "cpu", "smoke"):
        raise ValueError(f"unknown preset {preset!r} for configs/tools.py; expected smoke or "
                         f"cpu")
    config = default.get_config(preset)
    config.stages = "pretrain,eval_base,eval_base_no_tool,rl,eval_final,eval_final_no_tool"
    config.task.name = "tool_arithmetic"
    # Operands of 3 or 4 digits; most noisy worked solutions call the calculator.
    config.task.kwargs = ml_collections.ConfigDict({"difficulty": (1, 2), "tool_rate": 0.8})
    config.task.solution_error_rate = 0.2  # a miscopied operand or result (or a wrong guess)
    config.task.format_error_rate = 0.1
    config.task.prompt_len = 24
    config.model.max_seq_len = 80  # prompt bucket + the whole episode
    # Copying the operands into the call and the result into the answer (induction over
    # repeated digits) takes the tiny model a few thousand steps.
    config.pretrain.steps = 2500
    config.pretrain.pack_len = 80

    config.rl.tools = "calc"
    config.rl.max_turns = 2
    config.rl.max_observation_tokens = 16  # <result>, up to 11 characters, </result>
    config.rl.max_new_tokens = 48  # the episode: calls, observations and the answer
    config.rl.fused_steps = 0  # the turns need the host (the calculator runs there)
    config.rl.steps = 60
    config.rl.num_prompts = 16
    config.rl.group_size = 8
    # correct_call (weight 0): the completion called the calculator on an expression worth
    # the reference answer; logged as reward/correct_call (the rate of correct tool use).
    config.rl.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2,
                                                   "correct_call": 0.0})
    for name in EVALS:
        section = ml_collections.ConfigDict(config.eval_base.to_dict())
        section.tools = "" if name.endswith("no_tool") else "calc"
        section.max_turns = config.rl.max_turns
        section.max_observation_tokens = config.rl.max_observation_tokens
        section.max_new_tokens = config.rl.max_new_tokens
        config[name] = section

    if preset == "smoke":
        # Enough pretraining on calls only (tool_rate 1) for the policy to close calls, so
        # the episodes have turns; the overlong ramp's rewards differ within groups.
        config.task.kwargs.tool_rate = 1.0
        config.pretrain.steps = 60
        config.pretrain.batch_size = 16
        config.pretrain.pack_len = 64
        config.rl.steps = 2
        config.rl.num_prompts = 4
        config.rl.group_size = 4
        for name in EVALS:
            config[name].update(num_samples=2, batch_size=16)
    return config
