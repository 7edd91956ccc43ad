"""Guess a hidden number in a range with the environment's feedback (`tools.games`).

Problem: a range "lo-hi" (8 numbers at difficulty 1, 16 at 2, 32 at 3), the hidden number
its answer. Played in multi-turn episodes (`rl.tools=guess`): each turn is
`<guess>N</guess>`, the environment answers `<result>higher</result>` or
`<result>lower</result>`, and the episode ends when a guess is the number. A worked
solution is a bisection:

    <guess>20</guess><result>higher</result><guess>24</guess><result>lower</result><guess>22</guess>

Noisy worked solutions (the pretraining data) bisect with probability `search_rate` and
otherwise guess numbers of the range at random (never twice), ignoring the feedback, for
at most `max_guesses` guesses; a trace that finds the number ends there (the environment
ends the episode there). A model pretrained on
them guesses in the format, follows the feedback sometimes, and finds the number within a
few turns part of the time: RL has the use of the feedback to raise.

Rewards: "accuracy" (the completion guessed the number), "turns" (minus the guesses it
took, over the range's bisection depth: 0 is best) and the environment's own
("environment": 1 at the guess that finds it).
"""

from __future__ import annotations

import numpy as np

from grpo_jax.tasks.base import Example, Task, check_rate
from grpo_jax.tasks.registry import register_task
from grpo_jax.tools.base import render_observation
from grpo_jax.tools.games import GUESS

# difficulty -> numbers in the range
_WIDTH = {1: 8, 2: 16, 3: 32}
TAGS = ("<guess>", "</guess>", "<result>", "</result>")


def bisection(low: int, high: int, number: int) -> list[tuple[int, str]]:
    """The guesses of a bisection of [low, high] for `number`, each with its feedback
    ("higher", "lower", or "" for the last)."""
    out = []
    while True:
        guess = (low + high + 1) // 2
        if guess == number:
            return out + [(guess, "")]
        if number > guess:
            out.append((guess, "higher"))
            low = guess + 1
        else:
            out.append((guess, "lower"))
            high = guess - 1


def trace(turns: list[tuple[int, str]]) -> str:
    """The episode's text: each guess, then its feedback as the environment writes it."""
    return "".join(f"<guess>{guess}</guess>" + (render_observation(said) if said else "")
                   for guess, said in turns)


@register_task("guess_number")
class GuessNumberTask(Task):
    """A hidden number in a range of 8 / 16 / 32 numbers (difficulty 1, 2, 3)."""

    name = "guess_number"
    tags = TAGS
    observations = r"<result>.*?</result>"  # the environment's answers
    characters = "-"

    def __init__(self, difficulty=(1, 2), *, search_rate: float = 0.5, max_guesses: int = 6):
        """Args: difficulty (int or list); search_rate: the probability that a noisy
        worked solution bisects (the rest guess at random); max_guesses: a worked solution
        stops after this many guesses (the episode's budget), found or not."""
        super().__init__(difficulty)
        self.search_rate = check_rate("search_rate", search_rate)
        if not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"max_guesses: expected an int >= 1, got {max_guesses!r}")
        self.max_guesses = max_guesses

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        width = _WIDTH.get(difficulty, 2 ** (difficulty + 2))
        low = int(rng.integers(0, 100 - width))
        high = low + width - 1
        number = int(rng.integers(low, high + 1))
        return Example(id=f"guess_number:{low}-{high}:{number}", prompt=f"{low}-{high}",
                       answer=str(number), solution=trace(bisection(low, high, number)),
                       difficulty=difficulty, meta={"low": low, "high": high})

    def solution(self, example: Example, *, rng, error_rate: float = 0.0,
                 format_error_rate: float = 0.0) -> tuple[str, bool]:
        """A noisy worked solution (module docstring); (completion, is_correct).
        error_rate: the probability that a bisection step takes a neighbour of the middle."""
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        low, high = example.meta["low"], example.meta["high"]
        number = int(example.answer)
        turns = []
        if rng.random() < self.search_rate:
            lo, hi = low, high
            while True:
                guess = (lo + hi + 1) // 2
                if rng.random() < error_rate:
                    guess = int(np.clip(guess + rng.choice([-1, 1]), lo, hi))
                if guess == number:
                    turns.append((guess, ""))
                    break
                turns.append((guess, "higher" if number > guess else "lower"))
                lo, hi = (guess + 1, hi) if number > guess else (lo, guess - 1)
        else:
            for guess in rng.permutation(np.arange(low, high + 1)):
                guess = int(guess)
                turns.append((guess, "" if guess == number else
                              ("higher" if number > guess else "lower")))
                if guess == number:
                    break
        if len(turns) > self.max_guesses:  # out of turns: the last guess gets no answer
            turns = turns[:self.max_guesses - 1] + [(turns[self.max_guesses - 1][0], "")]
        text = trace(turns)
        if rng.random() < format_error_rate:
            text = text.replace("</guess>", "", 1)
        return text, self.is_correct(text, example)

    def is_correct(self, completion: str, example: Example) -> bool:
        return any(int(g) == int(example.answer) for g in GUESS.findall(completion))

    def extract_answer(self, completion: str) -> str | None:
        """The episode's last guess (its final answer: maj@k votes over them)."""
        guesses = GUESS.findall(completion)
        return str(int(guesses[-1])) if guesses else None

    def guesses(self, completion: str) -> int:
        """How many guesses a completion made."""
        return len(GUESS.findall(completion))

    def turn_reward(self, completion: str, example: Example) -> float:
        """Minus the guesses beyond the bisection's, over the range's width (0 when it
        found the number as fast as bisection would; -1 when it did not find it)."""
        if not self.is_correct(completion, example):
            return -1.0
        low, high = example.meta["low"], example.meta["high"]
        best = len(bisection(low, high, int(example.answer)))
        return -max(self.guesses(completion) - best, 0) / (high - low + 1)

    def reward_fns(self):
        """accuracy (guessed the number), format (every turn is a well-formed guess) and
        turns (`turn_reward`)."""
        return {"accuracy": lambda c, ex: float(self.is_correct(c, ex)),
                "format": lambda c, ex: float(bool(GUESS.search(c)) and
                                              c.count("<guess>") == c.count("</guess>")),
                "turns": self.turn_reward}


__all__ = ["GuessNumberTask", "bisection", "trace"]
