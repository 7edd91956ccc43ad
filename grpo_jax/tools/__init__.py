"""Tools a policy calls during an episode (multi-turn rollouts).

A tool is a function text -> observation text. `call_tool` runs one under a deadline and an
output cap, so a tool never crashes or stalls a run: errors, timeouts and oversized outputs
come back as observations.
"""

from grpo_jax.tools.base import (TOOLS, ToolCall, answer, call_tool, find_call,
                                 render_observation)
from grpo_jax.tools.calculator import calculate, evaluate
from grpo_jax.tools.environment import ToolEnvironment

__all__ = ["TOOLS", "ToolCall", "ToolEnvironment", "answer", "calculate", "call_tool",
           "evaluate", "find_call", "render_observation"]
