"""The environment of a multi-turn rollout: the policy's tool calls change its state.

    environment = ToolEnvironment(tool="calc")
    out = sampling.generate_episodes(..., observe=environment, ...)

An episode starts from the problem's prompt (the environment's reset is the prompt itself).
A turn ends when the policy closes a call (`environment.stop_text`, e.g. "</calc>"); the
environment runs the turn's last call under `tools.call_tool`'s deadline and output cap and
answers with an observation, which the sampler appends to the context (attended to, never
trained on). The episode ends when the policy ends its answer (EOS), runs out of turns or
out of tokens. Tools are pure and bounded, so the same turn text always gets the same
observation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from grpo_jax.tools.base import (DEADLINE_SECONDS, MAX_OBSERVATION_CHARS, TOOLS, answer,
                                 render_observation)
from grpo_jax.tools.sandbox import STOP_PREFIXES


@dataclasses.dataclass(frozen=True)
class ToolEnvironment:
    """One tool's environment: `environment(turn_text) -> observation text`.

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
        return f"</{self.tool}>"

    def __call__(self, turn_text: str) -> str:
        return answer(turn_text, tools={self.tool: TOOLS[self.tool]},
                      deadline_seconds=self.deadline_seconds, max_chars=self.max_chars,
                      render=self.render)

    def is_error(self, observation_text: str) -> bool:
        """Whether an observation (as rendered) reports a failed call: the tool's error, or
        (python) a line saying what stopped the program."""
        prefixes = STOP_PREFIXES if self.tool == "python" else ("error:",)
        return any(prefix in observation_text for prefix in prefixes)
