"""The environment of a multi-turn rollout.

    environment = ToolEnvironment(tool="calc")
    states = [environment.reset(example)[1] for example in examples]
    out = sampling.generate_episodes(..., observe=environment, states=states, ...)

An `Environment` has state: `reset(problem) -> (observation, state)` starts an episode
(the observation is appended to the problem's prompt; "" for none), and
`step(state, action_text) -> (observation, reward, done, state)` answers one turn. A turn
ends when the policy closes its action (`stop_text`, e.g. "</calc>"); the observation is
appended to the context (attended to, never trained on), the reward is the turn's (summed
into the episode's return as the reward component "environment", and placed on the turn's
last token for per-token credit), and `done` ends the episode there. An episode also ends
when the policy ends its answer (EOS) or runs out of turns or tokens.

The sampler calls `reset` and `step` through `tools.guard` only, so an environment cannot
stop or stall a run: an exception (SystemExit included), a call slower than `call_seconds`,
an observation longer than `max_answer_chars`, or a reward that is not a finite number
becomes an error observation with reward 0, counted in `tool_errors`.

`ToolEnvironment` is the stateless kind: each turn's last call is run under
`tools.call_tool`'s deadline and output cap, with no reward and never done; tools are
bounded, so the same turn text always gets the same observation. `tools.games` has a
stateful one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from grpo_jax.tools.base import (DEADLINE_SECONDS, MAX_OBSERVATION_CHARS, TOOLS, answer,
                                 render_observation)
from grpo_jax.tools.guard import CALL_SECONDS, MAX_ANSWER_CHARS
from grpo_jax.tools.sandbox import STOP_PREFIXES


class Environment:
    """A multi-turn environment (module docstring). Subclasses define `stop_text` and
    `step`; `reset` defaults to no observation and no state."""

    stop_text: str = ""
    # whether the episode's return has rewards of the environment's own (`step`'s)
    gives_rewards = False
    # how many rows' turns may be answered at once (threads: `step` must then be safe to
    # call concurrently, as a pure function of its state and text is)
    parallel_steps = 1
    # the wall bound on one reset or step call, and the longest observation (characters)
    # one may return: past either the call is answered with an error (`tools.guard`)
    call_seconds = CALL_SECONDS
    max_answer_chars = MAX_ANSWER_CHARS

    def reset(self, problem) -> tuple[str, Any]:
        """(the observation appended to the problem's prompt, the episode's first state)."""
        del problem
        return "", None

    def step(self, state, action_text: str) -> tuple[str, float, bool, Any]:
        """(observation, reward, done, next state) for the turn `action_text` (the text the
        policy generated since its last observation, its closing `stop_text` included)."""
        raise NotImplementedError

    def is_error(self, observation_text: str) -> bool:
        """Whether an observation reports a failed action (counted as tool_errors)."""
        del observation_text
        return False


class StatelessEnvironment(Environment):
    """An environment that answers each turn from the turn's text alone (`__call__`): no
    state, no reward, never done. The tools' environments are of this kind."""

    def __call__(self, turn_text: str) -> str:
        raise NotImplementedError

    def step(self, state, action_text: str) -> tuple[str, float, bool, Any]:
        return self(action_text), 0.0, False, state


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
        return f"</{self.tool}>"

    @property
    def parallel_steps(self) -> int:
        """Rows answered at once: python calls are each a sandbox process."""
        return 4 if self.tool == "python" else 1

    @property
    def call_seconds(self) -> float:
        """The guard's bound on a step: the tool's own deadline and the default's slack."""
        return self.deadline_seconds + CALL_SECONDS

    def __call__(self, turn_text: str) -> str:
        return answer(turn_text, tools={self.tool: TOOLS[self.tool]},
                      deadline_seconds=self.deadline_seconds, max_chars=self.max_chars,
                      render=self.render)

    def is_error(self, observation_text: str) -> bool:
        """Whether an observation (as rendered) reports a failed call: the tool's error, or
        (python) a line saying what stopped the program."""
        prefixes = STOP_PREFIXES if self.tool == "python" else ("error:",)
        return any(prefix in observation_text for prefix in prefixes)
