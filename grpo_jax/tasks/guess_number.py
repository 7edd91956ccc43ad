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

With `calls="json"` the guesses are JSON function calls in the checkpoint convention
(`tools.calls`, `rl.tools=json:guess,python`) and the answers are `<tool_response>` turns, as
the miniature chat template (`task.chat_template=miniature`) writes them; with
`python_rate` > 0 a bisection's first step computes its middle with the python tool:

    <tool_call>{"name": "python", "arguments": {"code": "print((20+35+1)//2)"}}</tool_call>
    <tool_response>28\n</tool_response><tool_call>{"name": "guess", "arguments": {"number":
    "28"}}</tool_call><tool_response>lower</tool_response>...

Rewards: "accuracy" (the completion guessed the number), "turns" (minus the guesses it
took, over the range's bisection depth: 0 is best) and the environment's own
("environment": 1 at the guess that finds it).
"""

from __future__ import annotations

import json
import re

import numpy as np

from grpo_jax.tasks.base import Example, Task, check_rate
from grpo_jax.tasks.registry import register_task
from grpo_jax.tools.base import render_observation
from grpo_jax.tools.calls import CLOSE, OPEN, call_text
from grpo_jax.tools.games import GUESS

# difficulty -> numbers in the range
_WIDTH = {1: 8, 2: 16, 3: 32}
TAGS = ("<guess>", "</guess>", "<result>", "</result>")
JSON_TAGS = (OPEN, CLOSE, "<tool_response>", "</tool_response>")
CALLS = ("tags", "json")
# a guess in either format: <guess>N</guess>, or a JSON call's text (parsed by `guesses_in`)
_TURN = re.compile(r"<guess>\s*(-?\d{1,6})\s*</guess>|" + re.escape(OPEN) + r"(.*?)" +
                   re.escape(CLOSE), re.S)


def guesses_in(text: str) -> list[int]:
    """The guesses a completion made, in order: `<guess>N</guess>` turns and JSON calls of
    the `guess` tool with an integer number (other calls and malformed ones are not
    guesses)."""
    out = []
    for match in _TURN.finditer(text):
        if match.group(1) is not None:
            out.append(int(match.group(1)))
            continue
        try:
            call = json.loads(match.group(2))
            number = call["arguments"]["number"] if call.get("name") == "guess" else None
            if number is not None and re.fullmatch(r"\s*-?\d{1,6}\s*", str(number)):
                out.append(int(number))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out


def tool_response(text: str) -> str:
    """A tool's answer as the miniature chat template writes it."""
    return f"<tool_response>{text}</tool_response>"


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


def trace(turns: list[tuple[int, str]], calls: str = "tags", computed=()) -> str:
    """The episode's text: each guess, then its feedback as the environment writes it.
    `calls="json"`: the guesses as JSON calls and the answers as tool responses; a guess
    whose index is in `computed` is first computed with the python tool, as
    (low, high) -> its middle: `computed` maps the index to (low, high)."""
    if calls == "tags":
        return "".join(f"<guess>{guess}</guess>" + (render_observation(said) if said else "")
                       for guess, said in turns)
    out = []
    for index, (guess, said) in enumerate(turns):
        if index in dict(computed):
            low, high = dict(computed)[index]
            out.append(call_text("python", {"code": f"print(({low}+{high}+1)//2)"}) +
                       tool_response(f"{(low + high + 1) // 2}\n"))
        out.append(call_text("guess", {"number": str(guess)}) +
                   (tool_response(said) if said else ""))
    return "".join(out)


@register_task("guess_number")
class GuessNumberTask(Task):
    """A hidden number in a range of 8 / 16 / 32 numbers (difficulty 1, 2, 3)."""

    name = "guess_number"
    characters = "-"
    chat_user = "{question}"  # the chat template's user turn: the range alone

    def __init__(self, difficulty=(1, 2), *, search_rate: float = 0.5, max_guesses: int = 6,
                 calls: str = "tags", python_rate: float = 0.0):
        """Args: difficulty (int or list); search_rate: the probability that a noisy
        worked solution bisects (the rest guess at random); max_guesses: a worked solution
        stops after this many guesses (the episode's budget), found or not; calls: "tags"
        or "json" (module docstring); python_rate: with "json", the probability that a
        bisection's first step computes its middle with the python tool."""
        super().__init__(difficulty)
        self.search_rate = check_rate("search_rate", search_rate)
        if not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"max_guesses: expected an int >= 1, got {max_guesses!r}")
        self.max_guesses = max_guesses
        if calls not in CALLS:
            raise ValueError(f"calls: expected one of {CALLS}, got {calls!r}")
        self.calls = calls
        self.python_rate = check_rate("python_rate", python_rate)
        if self.python_rate and calls != "json":
            raise ValueError("python_rate: the python tool is called in JSON (calls='json')")
        # the environment's answers, kept out of supervised losses
        self.tags = TAGS if calls == "tags" else JSON_TAGS
        self.observations = (r"<result>.*?</result>" if calls == "tags" else
                             r"<tool_response>.*?</tool_response>")

    def render_answer(self, text: str) -> str:
        """An environment's answer as the worked solutions write it."""
        return render_observation(text) if self.calls == "tags" else tool_response(text)

    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        width = _WIDTH.get(difficulty, 2 ** (difficulty + 2))
        low = int(rng.integers(0, 100 - width))
        high = low + width - 1
        number = int(rng.integers(low, high + 1))
        # the clean solution computes its first middle with python as often as the noisy
        # ones do (no draw without python_rate: the tag format's problems stay as they were)
        computed = {0: (low, high)} if self.python_rate and rng.random() < self.python_rate \
            else {}
        return Example(id=f"guess_number:{low}-{high}:{number}", prompt=f"{low}-{high}",
                       answer=str(number),
                       solution=trace(bisection(low, high, number), self.calls, computed),
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
        turns, computed = [], {}
        if rng.random() < self.search_rate:
            lo, hi = low, high
            while True:
                guess = (lo + hi + 1) // 2
                if not turns and self.python_rate and rng.random() < self.python_rate:
                    computed[len(turns)] = (lo, hi)
                    guess = (lo + hi + 1) // 2  # the tool's answer, taken as it is
                elif rng.random() < error_rate:
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
        text = trace(turns, self.calls, {i: v for i, v in computed.items() if i < len(turns)})
        if rng.random() < format_error_rate:
            closing = "</guess>" if self.calls == "tags" else "}}"
            text = text.replace(closing, "", 1)
        return text, self.is_correct(text, example)

    def is_correct(self, completion: str, example: Example) -> bool:
        return int(example.answer) in guesses_in(completion)

    def extract_answer(self, completion: str) -> str | None:
        """The episode's last guess (its final answer: maj@k votes over them)."""
        guesses = guesses_in(completion)
        return str(guesses[-1]) if guesses else None

    def guesses(self, completion: str) -> int:
        """How many guesses a completion made."""
        return len(guesses_in(completion))

    def turn_reward(self, completion: str, example: Example) -> float:
        """Minus the guesses beyond the bisection's, over the range's width (0 when it
        found the number as fast as bisection would; -1 when it did not find it)."""
        if not self.is_correct(completion, example):
            return -1.0
        low, high = example.meta["low"], example.meta["high"]
        best = len(bisection(low, high, int(example.answer)))
        return -max(self.guesses(completion) - best, 0) / (high - low + 1)

    def well_formed(self, completion: str) -> bool:
        """Every turn is a well-formed guess (tags), or every call parses (JSON), and at
        least one guess was made."""
        if self.calls == "tags":
            return bool(GUESS.search(completion)) and \
                completion.count("<guess>") == completion.count("</guess>")
        calls = re.findall(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), completion, re.S)
        try:
            parsed = [json.loads(c) for c in calls]
        except ValueError:
            return False
        return bool(guesses_in(completion)) and completion.count(OPEN) == len(calls) and \
            all(isinstance(c, dict) and c.get("name") in ("guess", "python") for c in parsed)

    def reward_fns(self):
        """accuracy (guessed the number), format (`well_formed`) and turns
        (`turn_reward`)."""
        return {"accuracy": lambda c, ex: float(self.is_correct(c, ex)),
                "format": lambda c, ex: float(self.well_formed(c)),
                "turns": self.turn_reward}


__all__ = ["GuessNumberTask", "bisection", "guesses_in", "trace"]
