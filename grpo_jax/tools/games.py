"""A stateful environment whose answer needs the feedback of several turns: guess a hidden
number.

    environment = GuessEnvironment()
    observation, state = environment.reset(example)     # "", the hidden number and range
    observation, reward, done, state = environment.step(state, "<guess>8</guess>")
    # "<result>higher</result>", 0.0, False  (or "", 1.0, True when 8 is the number)

A turn is the policy's `<guess>N</guess>`; the environment answers "higher" or "lower"
(with `feedback=False`: "no", the same budget without the information), "error: no guess"
for a turn without a number, and ends the episode with reward 1 when the guess is the
number. The episode's return is 1 when the number is found within its turns, else 0; the
turns it took are the observations before the end. The task that poses the problems is
`tasks.guess_number`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from grpo_jax.tools.environment import Environment, render_observation

GUESS = re.compile(r"<guess>\s*(-?\d{1,6})\s*</guess>")


@dataclasses.dataclass(frozen=True)
class GuessState:
    """An episode's state: the hidden number and the guesses so far."""

    number: int
    guesses: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class GuessEnvironment(Environment):
    """Guess the hidden number `int(example.answer)` (module docstring).

    Attributes:
      feedback: answer "higher" / "lower" (True) or only "no" (False).
      render: the observation's text as the context sees it.
    """

    feedback: bool = True
    render: Callable[[str], str] = render_observation
    gives_rewards = True

    @property
    def stop_text(self) -> str:
        return "</guess>"

    def reset(self, problem) -> tuple[str, Any]:
        try:
            number = int(problem.answer)
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"GuessEnvironment.reset: the problem's answer must be the "
                             f"hidden number, got {getattr(problem, 'answer', problem)!r}")
        return "", GuessState(number)

    def step(self, state: GuessState, action_text: str) -> tuple[str, float, bool, GuessState]:
        guesses = GUESS.findall(action_text)
        return self.play(state, guesses[-1] if guesses else "")

    def play(self, state: GuessState, guess: str) -> tuple[str, float, bool, GuessState]:
        """`step` for a guess already read from the turn (its text: an integer, else the
        "error: no guess" answer)."""
        try:
            number = int(guess)
        except (TypeError, ValueError):
            return self.render("error: no guess"), 0.0, False, state
        state = dataclasses.replace(state, guesses=state.guesses + (number,))
        if number == state.number:
            return "", 1.0, True, state
        if not self.feedback:
            return self.render("no"), 0.0, False, state
        return self.render("higher" if state.number > number else "lower"), 0.0, False, state

    def is_error(self, observation_text: str) -> bool:
        return "error:" in observation_text
