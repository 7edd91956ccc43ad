"""Verifiable tasks: examples from a seed, prompt templates, noisy worked solutions, scoring.

Built-in tasks: "arithmetic", "countdown", "tool_arithmetic", "guess_number", "code_expression", "gsm8k" (read offline from a data directory), "reasoning_gym" (the reasoning-gym
package's generators, an optional extra). Add one with `@register_task("name")` on a
`Task` subclass (see README).
"""

from grpo_jax.tasks.base import Example, Task, malform, split_of, stable_hash
from grpo_jax.tasks.registry import (available_tasks, ensure_registered, get_task, register_task,
                                     task_arguments, task_of)
from grpo_jax.tasks.templates import TEMPLATES, apply_template, format_completion, get_template

# Built-in tasks register themselves on import.
from grpo_jax.tasks.arithmetic import ArithmeticTask  # noqa: E402  isort: skip
from grpo_jax.tasks.countdown import CountdownTask  # noqa: E402  isort: skip
from grpo_jax.tasks.gsm8k import GSM8KTask  # noqa: E402  isort: skip
from grpo_jax.tasks.tool_arithmetic import ToolArithmeticTask  # noqa: E402  isort: skip
from grpo_jax.tasks.guess_number import GuessNumberTask  # noqa: E402  isort: skip
from grpo_jax.tasks.code_expression import CodeExpressionTask  # noqa: E402  isort: skip
# Registers the name only; the reasoning-gym package is imported when the task is built.
from grpo_jax.tasks.reasoning_gym import ReasoningGymTask  # noqa: E402  isort: skip
from grpo_jax.tasks.file import FileTask  # noqa: E402  isort: skip

__all__ = [
    "ArithmeticTask",
    "CodeExpressionTask",
    "CountdownTask",
    "GSM8KTask",
    "GuessNumberTask",
    "ReasoningGymTask",
    "Example",
    "FileTask",
    "TEMPLATES",
    "Task",
    "ToolArithmeticTask",
    "apply_template",
    "ensure_registered",
    "available_tasks",
    "format_completion",
    "get_task",
    "get_template",
    "malform",
    "register_task",
    "task_arguments",
    "task_of",
    "split_of",
    "stable_hash",
]
