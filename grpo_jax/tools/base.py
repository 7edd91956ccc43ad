"""Tool calls in text, and running a tool so that it can never crash or stall a run.

A call is written `<calc>3 * (4 + 5)</calc>`: the tag names the tool, the closing tag is the
sampler's stop sequence, and the environment appends the observation `<result>27</result>`.
`call_tool` runs the tool under a deadline and an output cap; whatever goes wrong (an
unknown tool, an exception, a timeout, an output too long) comes back as an "error: ..."
observation.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
from collections.abc import Callable

from grpo_jax.tools.calculator import calculate
from grpo_jax.tools.sandbox import python_tool

# name -> tool (text -> observation). Tools are functions of their argument alone: the
# calculator is pure, python runs the code in a fresh sandbox process each call.
TOOLS: dict[str, Callable[[str], str]] = {"calc": calculate, "python": python_tool}
DEADLINE_SECONDS = 2.0
MAX_OBSERVATION_CHARS = 200

# Tools run on a small thread pool: a call past its deadline is answered with an error at
# once (its thread may finish later; a tool that can run away must cap itself, as the
# calculator does).
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpo_tool")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call found in generated text: the tool's name, its argument, and where the call
    ends in the text (just after its closing tag)."""

    name: str
    argument: str
    end: int


def find_call(text: str, tools=None) -> ToolCall | None:
    """The first complete call `<name>argument</name>` of a known tool in `text`, or None."""
    names = sorted(TOOLS if tools is None else tools)
    if not names:
        return None
    pattern = re.compile(r"<(" + "|".join(map(re.escape, names)) + r")>(.*?)</\1>", re.S)
    match = pattern.search(text)
    if match is None:
        return None
    return ToolCall(match.group(1), match.group(2), match.end())


def render_observation(observation: str) -> str:
    """The text appended to the context after a call."""
    return f"<result>{observation}</result>"


def call_tool(name: str, argument: str, *, tools=None,
              deadline_seconds: float = DEADLINE_SECONDS,
              max_chars: int = MAX_OBSERVATION_CHARS) -> str:
    """The observation of one call: the tool's output, or "error: ..." for an unknown tool,
    an exception, no answer within `deadline_seconds`, or an output over `max_chars`."""
    tools = TOOLS if tools is None else tools
    tool = tools.get(name)
    if tool is None:
        return f"error: unknown tool {name!r}"
    future = _POOL.submit(tool, argument)
    try:
        output = future.result(timeout=deadline_seconds)
    except concurrent.futures.TimeoutError:
        future.cancel()
        return f"error: no answer within {deadline_seconds:g} s"
    except Exception as err:  # noqa: BLE001  (a tool's failure is an observation)
        return f"error: {type(err).__name__}"
    if not isinstance(output, str):
        return "error: the tool returned no text"
    if len(output) > max_chars:
        return f"error: output longer than {max_chars} characters"
    return output


def answer(turn_text: str, *, tools=None, deadline_seconds: float = DEADLINE_SECONDS,
           max_chars: int = MAX_OBSERVATION_CHARS,
           render: Callable[[str], str] = render_observation) -> str:
    """The environment's reply to a turn (`sampling.generate_episodes`' observe): the
    observation of the last complete call in `turn_text`, or an error observation when the
    turn holds none, as `render` writes it."""
    names = sorted(TOOLS if tools is None else tools)
    calls = []
    text = turn_text
    while (call := find_call(text, names)) is not None:
        calls.append(call)
        text = text[call.end:]
    if not calls:
        return render("error: no complete tool call")
    call = calls[-1]
    return render(call_tool(call.name, call.argument, tools=tools,
                            deadline_seconds=deadline_seconds, max_chars=max_chars))

