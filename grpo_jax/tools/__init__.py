"""Tools and environments a policy acts on during an episode (multi-turn rollouts).

A tool is a function text -> observation text. `call_tool` runs one under a deadline and an
output cap, so a tool never crashes or stalls a run: errors, timeouts and oversized outputs
come back as observations. An environment (`Environment`: reset / step) keeps state across
turns, gives rewards and may end the episode; each tool is one (`ToolEnvironment`), and
`ENVIRONMENTS` has the stateful ones. `make_environment(name)` builds either by name (the
config's `tools` field).
"""

from collections.abc import Callable

from grpo_jax.tools.base import (TOOLS, ToolCall, answer, call_tool, find_call,
                                 render_observation)
from grpo_jax.tools.calculator import calculate, evaluate
from grpo_jax.tools.environment import Environment, ToolEnvironment
from grpo_jax.tools.games import GuessEnvironment

# name -> factory(render) of the stateful environments (beside the tools of TOOLS).
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "guess": lambda render: GuessEnvironment(feedback=True, render=render),
    "guess_blind": lambda render: GuessEnvironment(feedback=False, render=render),
}


def environment_names() -> tuple[str, ...]:
    """Every name `make_environment` takes."""
    return tuple(sorted(TOOLS)) + tuple(sorted(ENVIRONMENTS))


def make_environment(name: str, *, render: Callable[[str], str] = render_observation
                     ) -> Environment:
    """The environment `name`: a tool of TOOLS (`ToolEnvironment`) or one of ENVIRONMENTS;
    `render` writes its observations as the context sees them."""
    if name in TOOLS:
        return ToolEnvironment(tool=name, render=render)
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name](render)
    raise ValueError(f"tools: unknown tool or environment {name!r}; available: "
                     f"{list(environment_names())}")


__all__ = ["ENVIRONMENTS", "Environment", "GuessEnvironment", "TOOLS", "ToolCall",
           "ToolEnvironment", "answer", "calculate", "call_tool", "environment_names",
           "evaluate", "find_call", "make_environment", "render_observation"]
