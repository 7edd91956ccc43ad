"""Tool calls in the checkpoint's own format: JSON function calls between `<tool_call>` tags
(the Hermes / Qwen2.5 convention), answered in the chat template's tool role.

    environment = JsonToolEnvironment(tools=("python", "calc"), render=tokenizer_renderer)
    environment.schemas        # the tools described to the model (the template's tools=)
    # the policy writes: <tool_call>{"name": "calc", "arguments": {"expression": "3*9"}}</tool_call>
    environment(turn_text)     # the answer, e.g. "<tool_response>\\n27\\n</tool_response>..."

The tools, their parameters and descriptions are the records of `tools.table.TABLE`.
`guess` is a tool with state: the guessing game of `tools.games` (`GuessEnvironment`, its
record's `game`), its guesses made as calls (`{"name": "guess", "arguments": {"number":
"20"}}`); with it the environment keeps the game's state, gives its reward and ends the
episode when the number is found, and every other tool still answers from the call alone.

A turn ends at the closing tag `</tool_call>`. The turn's last call is parsed as JSON: an
object with a string "name" naming one of the environment's tools and an object "arguments"
(a JSON string holding one is accepted, as some templates write it) with the tool's one
required parameter. A call that does not parse is never dropped silently: it is answered
with an error observation ("error: tool call not parsed: ...") and counted
(`is_parse_failure`; `tool_parse_failures` in the training and evaluation metrics); so is
JSON nested too deeply for the parser or an integer past Python's digit limit. Like every
environment, it is called through `tools.guard`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from grpo_jax.tools.base import (DEADLINE_SECONDS, MAX_OBSERVATION_CHARS, call_tool,
                                 render_observation)
from grpo_jax.tools.environment import CALL_SECONDS, Environment
from grpo_jax.tools.table import TABLE, error_prefixes, parallel_steps

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PARSE_FAILURE = "error: tool call not parsed"
# tool -> (its one parameter, the function's description for the model): the table's
PARAMETERS = {name: (tool.parameter, tool.description) for name, tool in TABLE.items()}
STATEFUL = tuple(name for name, tool in TABLE.items() if tool.stateful)
# JSON calls' answers share one format: an error prefix of any tool marks a failed call
ERROR_PREFIXES = error_prefixes(TABLE)
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def schema(name: str) -> dict:
    """The tool's description in the JSON-schema form chat templates take (`tools=`)."""
    return TABLE[name].schema


def call_text(name: str, arguments: dict) -> str:
    """A call as the policy writes it."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


class ToolCallError(ValueError):
    """A tool call that does not parse (its message says why, in a few words)."""


def _json(text: str):
    """json.loads, every failure a ToolCallError: besides malformed text, nesting deeper
    than the interpreter's recursion allows (RecursionError) and integers past Python's
    digit limit (ValueError) are what a policy can write."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolCallError(f"not JSON ({err.msg} at character {err.pos})") from None
    except RecursionError:
        raise ToolCallError("not JSON (nested too deeply)") from None
    except Exception as err:  # noqa: BLE001  (e.g. ValueError: an integer of 4,301 digits)
        reason = str(err).split(":")[0][:80]  # its first clause: the limit it passed
        raise ToolCallError(f"not JSON ({type(err).__name__}: {reason})") from None


def parse_call(text: str, tools) -> tuple[str, str]:
    """(tool name, its argument) of the last complete call in `text`; ToolCallError when
    there is none or it is not a JSON object with a known "name" and its "arguments"."""
    calls = _CALL.findall(text)
    if not calls:
        raise ToolCallError(f"no {OPEN}...{CLOSE}")
    call = _json(calls[-1])
    if not isinstance(call, dict):
        raise ToolCallError("not a JSON object")
    name = call.get("name")
    if not isinstance(name, str) or name not in tools:
        raise ToolCallError(f"unknown tool {name!r:.40}; tools: {', '.join(tools)}")
    arguments = call.get("arguments", call.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = _json(arguments)
        except ToolCallError:
            raise ToolCallError("arguments is a string that is not a JSON object") from None
    parameter = TABLE[name].parameter
    if not isinstance(arguments, dict) or not isinstance(arguments.get(parameter), str):
        raise ToolCallError(f"{name} needs arguments {{\"{parameter}\": string}}")
    return name, arguments[parameter]


@dataclasses.dataclass(frozen=True)
class JsonToolEnvironment(Environment):
    """Tools called as JSON function calls (module docstring). Without `guess` it is
    stateless (reward 0, never done) and `environment(turn_text)` answers a turn; with it
    the episode's state is the game's (`reset(problem)`, `step(state, turn_text)`).

    Attributes:
      tools: the tools' names (of `tools.table.TABLE`; one stateful at most).
      render: the answer's text as the context sees it (a checkpoint's tool turn:
        `text.chat.tool_response_renderer`; default "<result>...</result>").
      deadline_seconds, max_chars: each call's, as `tools.call_tool` takes them.
      feedback: the guessing game answers "higher" / "lower" (True) or only "no".
    """

    tools: tuple[str, ...] = ("calc",)
    render: Callable[[str], str] = render_observation
    deadline_seconds: float = DEADLINE_SECONDS
    max_chars: int = MAX_OBSERVATION_CHARS
    feedback: bool = True

    def __post_init__(self):
        unknown = [name for name in self.tools if name not in TABLE]
        if not self.tools or unknown:
            raise ValueError(f"tools: JSON calls take tools of {sorted(PARAMETERS)}, got "
                             f"{list(self.tools)}")
        stateful = [name for name in self.tools if TABLE[name].stateful]
        if len(set(stateful)) > 1:
            raise ValueError(f"tools: one stateful tool keeps an episode's state, got "
                             f"{stateful}")

    @property
    def gives_rewards(self) -> bool:
        return any(TABLE[name].stateful for name in self.tools)

    @property
    def parallel_steps(self) -> int:
        """Rows answered at once: the most any of its tools' records allows (python calls
        are each a sandbox process)."""
        return parallel_steps(self.tools)

    @property
    def call_seconds(self) -> float:
        """The guard's bound on a step: the tool's own deadline and the default's slack."""
        return self.deadline_seconds + CALL_SECONDS

    @property
    def stop_text(self) -> str:
        return CLOSE

    @property
    def schemas(self) -> list[dict]:
        """The tools as the chat template's `tools=` describes them."""
        return [schema(name) for name in self.tools]

    def _game(self, name: str | None = None):
        """The environment of the stateful tool `name` (default: the one among its tools)."""
        if name is None:
            name = next(name for name in self.tools if TABLE[name].stateful)
        return TABLE[name].game(feedback=self.feedback, render=self.render)

    def reset(self, problem) -> tuple[str, Any]:
        return self._game().reset(problem) if self.gives_rewards else ("", None)

    def step(self, state, action_text: str) -> tuple[str, float, bool, Any]:
        try:
            name, argument = parse_call(action_text, self.tools)
        except ToolCallError as err:
            return self.render(f"{PARSE_FAILURE}: {err}"), 0.0, False, state
        tool = TABLE[name]
        if tool.stateful:
            return self._game(name).play(state, argument)
        return self.render(call_tool(name, argument, tools={name: tool.fn},
                                     deadline_seconds=self.deadline_seconds,
                                     max_chars=self.max_chars)), 0.0, False, state

    def __call__(self, turn_text: str) -> str:
        if self.gives_rewards:
            raise TypeError("JsonToolEnvironment: with a stateful tool (guess) a turn is "
                            "answered by step(state, turn_text)")
        return self.step(None, turn_text)[0]

    def is_error(self, observation_text: str) -> bool:
        return any(prefix in observation_text for prefix in ERROR_PREFIXES)

    def is_parse_failure(self, observation_text: str) -> bool:
        return PARSE_FAILURE in observation_text


def call_objects(text: str) -> list[tuple[str, dict]]:
    """(name, arguments) of every complete call in `text`, in order, that parses as a JSON
    object with a string "name" and an object "arguments" (or a JSON string holding one);
    any tool name. A call that does not parse is left out (the text still holds it)."""
    found = []
    for call in _CALL.findall(text):
        try:
            value = _json(call)
            if not isinstance(value, dict):
                continue
            arguments = value.get("arguments", value.get("parameters", {}))
            if isinstance(arguments, str):
                arguments = _json(arguments)
        except ToolCallError:
            continue
        if isinstance(value.get("name"), str) and isinstance(arguments, dict):
            found.append((value["name"], arguments))
    return found
