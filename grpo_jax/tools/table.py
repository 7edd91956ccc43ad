"""The tools as records, in one table: what a call runs, how a turn with it ends, which
answers are errors, how many rows' calls may run at once, how the model is told of it, and
whether it keeps an episode's state. A new tool is one entry here; `tools.base` (tag calls
and their `ToolEnvironment`), `tools.calls` (JSON calls) and `tools.__init__` read it. The
tools' functions (`tools.calculator`, `tools.sandbox`, `tools.games`) sit below it.

    TABLE["calc"].stop            # "</calc>": a tag call's closing tag, the sampler's stop
    TABLE["python"].parallel_steps  # 4: each call is a sandbox process
    TABLE["calc"].schema          # the JSON-schema form chat templates take (`tools=`)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from grpo_jax.tools.calculator import calculate
from grpo_jax.tools.games import GuessEnvironment
from grpo_jax.tools.sandbox import STOP_PREFIXES, python_tool


@dataclasses.dataclass(frozen=True)
class Tool:
    """One tool.

    Attributes:
      name: its name: the tag of a tag call (`<calc>...</calc>`) and a JSON call's "name".
      parameter: the one parameter a JSON call passes (`{"expression": "3*9"}`).
      description: the function's description for the model (`schema`).
      fn: text -> observation text, for a tool that answers from its argument alone;
        None for a stateful one.
      game: for a stateful tool, factory(feedback=, render=) of the environment whose
        `reset(problem)` starts its state and `play(state, argument)` answers a call.
      error_prefixes: an observation holding any of these reports a failed call
        (counted in `tool_errors`).
      parallel_steps: how many rows' calls may be answered at once (threads).
    """

    name: str
    parameter: str
    description: str
    fn: Callable[[str], str] | None = None
    game: Callable | None = None
    error_prefixes: tuple[str, ...] = ("error:",)
    parallel_steps: int = 1

    @property
    def stateful(self) -> bool:
        """Whether it keeps an episode's state (and gives the episode's rewards)."""
        return self.game is not None

    @property
    def stop(self) -> str:
        """A tag call's closing tag: the text that ends the policy's turn."""
        return f"</{self.name}>"

    @property
    def schema(self) -> dict:
        """Its description in the JSON-schema form chat templates take (`tools=`)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": {"type": "object",
                                            "properties": {self.parameter: {"type": "string"}},
                                            "required": [self.parameter]}}}


TABLE: dict[str, Tool] = {tool.name: tool for tool in (
    Tool("calc", "expression",
         "Evaluates an arithmetic expression (integers and fractions, + - * / // % ** and "
         "parentheses) exactly.",
         fn=calculate),
    Tool("python", "code",
         "Runs a short Python program in a sandbox and returns what it prints (1 s, standard "
         "library only, no files outside its directory, no network).",
         fn=python_tool, error_prefixes=STOP_PREFIXES, parallel_steps=4),
    Tool("guess", "number",
         "Guesses the hidden number: the answer says whether it is higher or lower, and the "
         "game ends when the guess is the number.",
         game=GuessEnvironment),
)}


def error_prefixes(names) -> tuple[str, ...]:
    """The error prefixes of the tools `names`, each once."""
    out: list[str] = []
    for name in names:
        out.extend(p for p in TABLE[name].error_prefixes if p not in out)
    return tuple(out)


def parallel_steps(names) -> int:
    """The most rows' calls the tools `names` may have answered at once."""
    return max(TABLE[name].parallel_steps for name in names)
