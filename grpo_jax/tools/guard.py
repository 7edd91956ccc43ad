"""The one door into an environment: every `reset` and `step` of a run goes through
`guarded_reset` / `guarded_step`, so no environment, built in or a user's, can stop or stall
a run.

    start = guarded_reset(environment, problem)     # Start(observation, state, failed)
    answer = guarded_step(environment, state, text)  # Answer(observation, reward, done,
                                                     #        state, failed)

Each call runs in a daemon thread of its own (so not in the main thread: an environment
cannot set signal handlers), waited for at most the environment's `call_seconds`
(CALL_SECONDS unless it sets one). Whatever goes wrong becomes a one-line error
observation ("error: environment step raised ValueError: ...") and `failed`, which the
sampler counts in `tool_errors`:

- any exception, `SystemExit` included (a user's environment exiting is not the run's own
  stop); only `KeyboardInterrupt` is raised again, since that is how the run is stopped;
- no return within the wall bound: the call is answered at once and its thread abandoned
  (a daemon, so it cannot hold the process open; an environment that can hang should bound
  itself, as the tools do, since the abandoned thread still holds what it holds);
- an answer that is not (text, number, bool-like, state), an observation longer than the
  environment's `max_answer_chars` (MAX_ANSWER_CHARS), or a reward that is not one finite
  float32 number.

A failed step leaves the episode going with its state unchanged and reward 0. A failed
reset starts the episode with no observation (the prompt bucket is fixed, an error text
could overflow it) and the state `NotStarted(reason)`: each of its steps is answered with
the reset's error line without calling the environment, so `step` never sees a state it
did not make. `judge` calls `is_error` / `is_parse_failure` (inline: they read a text) and
answers None where one raised, which the sampler counts as an error.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from grpo_jax.tools.environment import CALL_SECONDS, MAX_ANSWER_CHARS, render_observation

MAX_REASON_CHARS = 160  # an error observation's line
FLOAT32_MAX = float(np.finfo(np.float32).max)


class NotStarted(NamedTuple):
    """The state of an episode whose reset failed, with the reset's error line."""

    reason: str


class Start(NamedTuple):
    observation: str
    state: Any
    failed: bool


class Answer(NamedTuple):
    observation: str
    reward: float
    done: bool
    state: Any
    failed: bool


def _line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def _bounded(function: Callable, args: tuple, seconds: float, what: str):
    """(value, None) of `function(*args)` run in a thread of its own, or (None, why) when
    it raised or did not return within `seconds`. KeyboardInterrupt is raised again."""
    outcome: dict[str, Any] = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as err:  # noqa: BLE001  (reported in the caller's thread)
            outcome["error"] = err

    thread = threading.Thread(target=target, name=f"grpo_environment_{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return None, f"error: environment {what} gave no answer within {seconds:g} s"
    if "error" in outcome:
        err = outcome.pop("error")
        if isinstance(err, KeyboardInterrupt):
            raise err
        detail = str(err)
        return None, _line(f"error: environment {what} raised {type(err).__name__}"
                           + (f": {detail}" if detail else ""))
    return outcome["value"], None


def _render(environment, text: str) -> str:
    """An error line as the environment writes its observations (its `render`, when it has
    one that works), else "<result>...</result>"."""
    render = getattr(environment, "render", None)
    if callable(render):
        try:
            rendered = render(text)
            if isinstance(rendered, str) and len(rendered) <= _cap(environment):
                return rendered
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001  (a broken render falls back to the default)
            pass
    return render_observation(text)


def _cap(environment) -> int:
    return int(getattr(environment, "max_answer_chars", MAX_ANSWER_CHARS))


def _seconds(environment) -> float:
    return float(getattr(environment, "call_seconds", CALL_SECONDS))


def _observation_error(environment, observation, what: str) -> str | None:
    if not isinstance(observation, str):
        return f"error: environment {what} gave a {type(observation).__name__}, not text"
    if len(observation) > _cap(environment):
        return (f"error: environment {what} answered {len(observation)} characters, over "
                f"{_cap(environment)}")
    return None


def _reward(value) -> float | None:
    """`value` as a float when it is one finite real number within float32's range."""
    try:
        array = np.asarray(value)
        if array.shape != () or array.dtype.kind not in "biuf":
            return None
        number = float(array)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001  (not a number: an error answer)
        return None
    return number if math.isfinite(number) and abs(number) <= FLOAT32_MAX else None


def guarded_reset(environment, problem) -> Start:
    """`environment.reset(problem)` contained (module docstring)."""
    result, why = _bounded(environment.reset, (problem,), _seconds(environment), "reset")
    if why is None:
        if not (isinstance(result, tuple) and len(result) == 2):
            why = (f"error: environment reset returned {type(result).__name__}, not "
                   "(observation, state)")
        else:
            why = _observation_error(environment, result[0], "reset")
    if why is not None:
        return Start("", NotStarted(why), True)
    return Start(result[0], result[1], False)


def guarded_step(environment, state, text: str, step: Callable | None = None) -> Answer:
    """`step(state, text)` (default `environment.step`) contained (module docstring): the
    answer, or an error observation with reward 0, not done, the state unchanged."""
    if isinstance(state, NotStarted):
        return Answer(_render(environment, state.reason), 0.0, False, state, True)
    result, why = _bounded(step or environment.step, (state, text), _seconds(environment),
                           "step")
    if why is None:
        if not (isinstance(result, tuple) and len(result) == 4):
            why = (f"error: environment step returned {type(result).__name__}, not "
                   "(observation, reward, done, state)")
        else:
            observation, reward, done, next_state = result
            why = _observation_error(environment, observation, "step")
            number = _reward(reward)
            if why is None and number is None:
                why = _line(f"error: environment step's reward {reward!r:.40} is not a "
                            "finite float32 number")
            if why is None:
                try:
                    done = bool(done)
                except KeyboardInterrupt:
                    raise
                except BaseException:  # noqa: BLE001
                    why = f"error: environment step's done is a {type(done).__name__}"
            if why is None:
                return Answer(observation, number, done, next_state, False)
    return Answer(_render(environment, why), 0.0, False, state, True)


def judge(function: Callable[[str], Any] | None, text: str) -> bool | None:
    """`bool(function(text))` (False without one), or None when it raised."""
    if function is None:
        return False
    try:
        return bool(function(text))
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001  (the caller counts it as an error)
        return None
