"""The environment of a multi-turn rollout.

    environment = make_environment("calc")   # a tools.base.ToolEnvironment
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

What the sampler reads of an environment is declared on `Environment` with its default
(`stop_text`, `gives_rewards`, `parallel_steps`, `call_seconds`, `max_answer_chars`,
`render`, `schemas`, `is_error`, `is_parse_failure`); `as_environment` makes one of a plain
function of the turn's text, or of an object that only has some of them.

This module is the interface and imports nothing else of `tools`: the tools' environments
(`tools.base.ToolEnvironment`, `tools.calls.JsonToolEnvironment`) and `tools.games`'
stateful one subclass it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CALL_SECONDS = 10.0  # one reset or step, unless the environment sets `call_seconds`
MAX_ANSWER_CHARS = 8192  # one observation, unless the environment sets `max_answer_chars`


def render_observation(observation: str) -> str:
    """The text appended to the context after a call (the default `render`)."""
    return f"<result>{observation}</result>"


class Environment:
    """A multi-turn environment (module docstring). Subclasses define `stop_text` and
    `step`; `reset` defaults to no observation and no state. The class attributes and
    methods below are everything the sampler reads, with their defaults."""

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
    # observation -> the text the context sees (e.g. "<result>27</result>"); with one, a
    # long answer is cut inside its wrapper and error lines are written like answers
    render: Callable[[str], str] | None = None
    # the tools as a chat template's `tools=` describes them (JSON calls), or None
    schemas: list[dict] | None = None

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

    def is_parse_failure(self, observation_text: str) -> bool:
        """Whether an observation reports a call that did not parse (tool_parse_failures)."""
        del observation_text
        return False


class StatelessEnvironment(Environment):
    """An environment that answers each turn from the turn's text alone (`__call__`): no
    state, no reward, never done. The tools' environments are of this kind."""

    def __call__(self, turn_text: str) -> str:
        raise NotImplementedError

    def step(self, state, action_text: str) -> tuple[str, float, bool, Any]:
        return self(action_text), 0.0, False, state


class _Adapted(Environment):
    """An `Environment` over `observe`: a function of the turn's text (no state, no reward,
    never done), or an object with a `step` and some of the attributes `Environment`
    declares (the others take its defaults)."""

    _DECLARED = ("stop_text", "gives_rewards", "parallel_steps", "call_seconds",
                 "max_answer_chars", "render", "schemas", "reset", "is_error",
                 "is_parse_failure")

    def __init__(self, observe):
        self.observe = observe
        for name in self._DECLARED:  # the one place an environment's attributes are probed
            if hasattr(observe, name):
                setattr(self, name, getattr(observe, name))
        step = getattr(observe, "step", None)
        if step is None:  # a function of the turn's text
            step = lambda state, text: (observe(text), 0.0, False, state)  # noqa: E731
        self.step = step


def as_environment(observe) -> Environment:
    """`observe` if it is an `Environment`, else an `Environment` over it: a function of the
    turn's text (its answer; no state, no reward, never done) or an object shaped like one
    (its `step` and whichever declared attributes it has; the rest are the defaults)."""
    return observe if isinstance(observe, Environment) else _Adapted(observe)
