"""Tools and environments a policy acts on during an episode (multi-turn rollouts).

A tool is a record of `TABLE` (`Tool`: its function text -> observation text, stop text,
error prefixes, parallel steps, schema, state); a new tool is one entry there. `call_tool`
runs one under a deadline and an output cap, so a tool never crashes or stalls a run:
errors, timeouts and oversized outputs come back as observations. An environment
(`Environment`: reset / step) keeps state across turns, gives rewards and may end the
episode; each tool is one (`ToolEnvironment`, called as `<calc>...</calc>`),
"json:python,calc" calls tools as JSON function calls in the checkpoint's format
(`JsonToolEnvironment`), and `ENVIRONMENTS` has the stateful ones.
`make_environment(name)` builds any of them by name (the config's `tools` field), and
"openenv:URL" an environment an OpenEnv server serves (`tools.openenv`). The
sampler calls every environment's `reset` and `step` through `guard`, so an environment,
built in or a user's, never crashes or stalls a run either.
"""

from collections.abc import Callable

from grpo_jax.tools.base import (TOOLS, ToolCall, ToolEnvironment, answer, call_tool,
                                 find_call, render_observation)
from grpo_jax.tools.calculator import calculate, evaluate
from grpo_jax.tools.calls import PARAMETERS as JSON_TOOLS
from grpo_jax.tools.calls import JsonToolEnvironment
from grpo_jax.tools.environment import Environment, as_environment
from grpo_jax.tools.games import GuessEnvironment
from grpo_jax.tools.openenv import PREFIX as OPENENV_PREFIX
from grpo_jax.tools.openenv import OpenEnvEnvironment
from grpo_jax.tools.openenv import name_error as openenv_name_error
from grpo_jax.tools.table import TABLE, Tool

# name -> factory(render) of the stateful environments (beside the tools of TOOLS).
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "guess": lambda render: GuessEnvironment(feedback=True, render=render),
    "guess_blind": lambda render: GuessEnvironment(feedback=False, render=render),
}


JSON_PREFIX = "json:"


def environment_names() -> tuple[str, ...]:
    """The names `make_environment` takes (besides "json:" with tools of JSON_TOOLS)."""
    return tuple(sorted(TOOLS)) + tuple(sorted(ENVIRONMENTS))


def environment_name_error(name: str) -> str | None:
    """Why `name` is no environment's name, or None when it is one."""
    if name in environment_names():
        return None
    if name.startswith(OPENENV_PREFIX):
        return openenv_name_error(name)
    if name.startswith(JSON_PREFIX):
        tools = [t.strip() for t in name[len(JSON_PREFIX):].split(",")]
        unknown = [t for t in tools if t not in JSON_TOOLS]
        if tools and not unknown:
            return None
        return (f"JSON calls take tools of {sorted(JSON_TOOLS)} ('json:python,calc'), got "
                f"{unknown or tools}")
    return (f"expected one of {['', *environment_names()]} or 'json:' and tools of "
            f"{sorted(JSON_TOOLS)}, got {name!r} (an OpenEnv server: 'openenv:URL')")


def make_environment(name: str, *, render: Callable[[str], str] = render_observation
                     ) -> Environment:
    """The environment `name`: a tool of TOOLS (`ToolEnvironment`) or one of ENVIRONMENTS;
    `render` writes its observations as the context sees them."""
    if name in TOOLS:
        return ToolEnvironment(tool=name, render=render)
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name](render)
    if name.startswith(OPENENV_PREFIX):
        return OpenEnvEnvironment.from_name(name, render=render)
    if environment_name_error(name) is None:
        tools = tuple(t.strip() for t in name[len(JSON_PREFIX):].split(","))
        return JsonToolEnvironment(tools=tools, render=render)
    raise ValueError(f"tools: unknown tool or environment {name!r}; available: "
                     f"{list(environment_names())}, 'json:' and tools of "
                     f"{sorted(JSON_TOOLS)}, or 'openenv:URL'")


__all__ = ["ENVIRONMENTS", "Environment", "GuessEnvironment", "JSON_TOOLS",
           "JsonToolEnvironment", "OPENENV_PREFIX", "OpenEnvEnvironment", "TABLE", "TOOLS",
           "Tool", "ToolCall", "ToolEnvironment",
           "answer", "as_environment", "calculate", "call_tool", "environment_name_error",
           "environment_names", "evaluate", "find_call", "make_environment",
           "render_observation"]
