"""Tool calls in text, and running a tool so that it can never crash or stall a run.

A call is written `<calc>3 * (4 + 5)</calc>`: the tag names the tool, the closing tag is the
sampler's stop sequence, and the environment appends the observation `<result>27</result>`.
`call_tool` runs the tool under a deadline and an output cap; whatever goes wrong (an
unknown tool, an exception, a timeout, an output too long) comes back as an "error: ..."
observation. `ToolEnvironment` is one tool's environment of such calls: each turn's last
call is run under `call_tool`'s deadline and output cap, with no reward and never done;
tools are bounded, so the same turn text always gets the same observation. Its stop text,
error prefixes and parallel steps are its tool's record (`tools.table`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
from collections.abc import Callable

from grpo_jax.tools.environment import CALL_SECONDS, StatelessEnvironment, render_observation
from grpo_jax.tools.table import TABLE

# name -> tool (text -> observation): the stateless tools of `tools.table.TABLE`, called as
# tags. They are functions of their argument alone: the calculator is pure, python runs the
# code in a fresh sandbox process each call.
TOOLS: dict[str, Callable[[str], str]] = {name: tool.fn for name, tool in TABLE.items()
                                          if not tool.stateful}
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


@dataclasses.dataclass(frozen=True)
class ToolEnvironment(StatelessEnvironment):
    """One tool's environment: `environment(turn_text) -> observation text`, and as an
    `Environment` that answer with no reward, never done.

    Attributes:
      tool: the tool's name in `tools.TOOLS` (its call is `<tool>argument</tool>`).
      deadline_seconds: each call's deadline.
      max_chars: the longest output a call may return.
      render: the observation's text as the context sees it (`render_observation`, or a
        checkpoint's tool turn: `text.chat.tool_response_renderer`).
    """

    tool: str = "calc"
    deadline_seconds: float = DEADLINE_SECONDS
    max_chars: int = MAX_OBSERVATION_CHARS
    render: Callable[[str], str] = render_observation

    def __post_init__(self):
        if self.tool not in TOOLS:
            raise ValueError(f"tools: unknown tool {self.tool!r}; available: {sorted(TOOLS)}")

    @property
    def stop_text(self) -> str:
        """The text that ends a turn: the call's closing tag."""
        return TABLE[self.tool].stop

    @property
    def parallel_steps(self) -> int:
        """Rows answered at once (the tool's record: python calls are each a sandbox
        process)."""
        return TABLE[self.tool].parallel_steps

    @property
    def call_seconds(self) -> float:
        """The guard's bound on a step: the tool's own deadline and the default's slack."""
        return self.deadline_seconds + CALL_SECONDS

    def __call__(self, turn_text: str) -> str:
        return answer(turn_text, tools={self.tool: TOOLS[self.tool]},
                      deadline_seconds=self.deadline_seconds, max_chars=self.max_chars,
                      render=self.render)

    def is_error(self, observation_text: str) -> bool:
        """Whether an observation (as rendered) reports a failed call: one of the tool's
        error prefixes (python: also a line saying what stopped the program)."""
        return any(prefix in observation_text for prefix in TABLE[self.tool].error_prefixes)
