"""A guess-the-number environment served with openenv-core's own server classes, for
tests/test_openenv.py (and docs/openenv.md's example):

    python tests/openenv_guess_server.py PORT      # serves on 127.0.0.1:PORT

The hidden number is the reset's `problem["answer"]` (else the seed modulo 16). A step's
action is `{"guess": "8"}`; the observation's one field `message` says "higher", "lower",
"correct" or "not a number". Rewards per step: 1 for the number (the episode ends there),
WRONG for any other guess; the episode also ends after MAX_GUESSES guesses.
"""

from __future__ import annotations

import sys

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

WRONG = -0.125
RIGHT = 1.0
MAX_GUESSES = 4
MAX_SESSIONS = 64  # the rows of a batch, each an episode open at once


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    message: str = ""


class GuessState(State):
    number: int = 0


class GuessGame(Environment):
    """One session's game."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = GuessState()

    def reset(self, seed=None, episode_id=None, problem=None, **kwargs) -> GuessObservation:
        answer = (problem or {}).get("answer")
        number = int(answer) if answer is not None else (seed or 0) % 16
        self._state = GuessState(episode_id=episode_id, step_count=0, number=number)
        return GuessObservation(message="", reward=None, done=False)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        out_of_guesses = self._state.step_count >= MAX_GUESSES
        try:
            guess = int(action.guess.strip())
        except ValueError:
            return GuessObservation(message="not a number", reward=WRONG, done=out_of_guesses)
        if guess == self._state.number:
            return GuessObservation(message="correct", reward=RIGHT, done=True)
        message = "higher" if self._state.number > guess else "lower"
        return GuessObservation(message=message, reward=WRONG, done=out_of_guesses)

    @property
    def state(self) -> GuessState:
        return self._state


def main(port: int) -> None:
    import uvicorn

    app = create_fastapi_app(GuessGame, GuessAction, GuessObservation,
                             max_concurrent_envs=MAX_SESSIONS)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))
