"""Task interface: deterministic example generation, noisy worked solutions, scoring.

A task samples `Example`s from a seed and scores completions. Synthetic tasks implement
`generate(rng, difficulty) -> Example`; the base class turns that into deterministic,
disjoint "train" / "test" splits: a problem belongs to the test split iff a stable hash of
its id falls in the first `test_fraction` of the hash range.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from grpo_jax.rewards.accuracy import answers_match, parse_number
from grpo_jax.rewards.format import soft_format_reward, strict_format_reward
from grpo_jax.rewards.parsing import extract_answer as _extract_answer
from grpo_jax.rewards.parsing import extract_thinking
from grpo_jax.tasks.templates import format_completion

SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem.

    Attributes:
      id: stable identifier (synthetic tasks: derived from the problem itself).
      prompt: the question text, without template.
      answer: reference answer string.
      solution: a worked solution (a full completion) or None.
      difficulty: difficulty level (int).
      meta: task-specific data (e.g. countdown numbers and target).
    """

    id: str
    prompt: str
    answer: str
    solution: str | None = None
    difficulty: int = 1
    meta: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain dict (JSON-friendly when meta is)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> "Example":
        """Inverse of `to_dict`; unknown keys are an error."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(record) - names)
        if unknown:
            raise ValueError(f"Example.from_dict: unknown fields {unknown}; expected {sorted(names)}")
        return cls(**record)


def stable_hash(text: str) -> int:
    """64-bit hash of a string, identical across processes and platforms."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def split_of(problem_id: str, test_fraction: float) -> str:
    """"test" when the problem's stable hash falls in the first `test_fraction` of the range."""
    return "test" if stable_hash(problem_id) < test_fraction * 2.0**64 else "train"


def _difficulties(difficulty) -> tuple[int, ...]:
    values = (difficulty,) if isinstance(difficulty, (int, np.integer)) else tuple(difficulty)
    if not values or any(not isinstance(d, (int, np.integer)) or d < 1 for d in values):
        raise ValueError(f"difficulty: expected an int >= 1 or a list of them, got {difficulty!r}")
    return tuple(int(d) for d in values)


def check_rate(name: str, value: float) -> float:
    """Validates a probability argument."""
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {value}")
    return float(value)


MALFORMATIONS = ("no_answer_close", "answer_outside_tags", "no_think_close", "no_tags")


def malform(thinking: str, answer: str, rng: np.random.Generator) -> str:
    """A malformed version of `<think>T</think><answer>A</answer>` (one of MALFORMATIONS).

    None of them has a closed answer-tag pair after the thinking, so each fails the strict
    format reward and the accuracy reward.
    """
    kind = MALFORMATIONS[int(rng.integers(len(MALFORMATIONS)))]
    if kind == "no_answer_close":
        return f"<think>{thinking}</think><answer>{answer}"
    if kind == "answer_outside_tags":
        return f"<think>{thinking}</think>{answer}"
    if kind == "no_think_close":
        return f"<think>{thinking} {answer}"
    return f"{thinking} {answer}"


class Task(abc.ABC):
    """Base class of verifiable tasks.

    Subclasses set `name` and implement `generate`; override `check_answer` for answers that
    are not compared with `answers_match`, and `solution` for noisy worked solutions.
    """

    name: str = "task"
    test_fraction: float = 0.1
    # Extra characters a CharTokenizer needs for this task beyond the default alphabet.
    characters: str = ""
    # Multi-character tokens (e.g. a tool's call tags) a CharTokenizer or SentencePiece model
    # keeps as one id each, beside the think / answer tags.
    tags: tuple[str, ...] = ()
    # A regular expression of the spans of a worked solution that an environment writes in
    # an episode (a tool's answer): supervised stages keep them out of the loss. None: none.
    observations: str | None = None
    # The user turn of the "chat" template, with "{question}" (None: the question and the
    # think / answer instruction, `templates.CHAT_USER`).
    chat_user: str | None = None
    # Names in `reward_fns()` that call code the task does not own behind the guard of
    # Python rewards (`rewards.python.guarded_call`): the RL loop logs the guard's counts
    # (`reward_errors`, ...) when a section uses one.
    guarded_rewards: tuple[str, ...] = ()

    def __init__(self, difficulty: int | Sequence[int] = 1):
        self.difficulties = _difficulties(difficulty)

    @property
    def difficulty(self) -> int | tuple[int, ...]:
        return self.difficulties[0] if len(self.difficulties) == 1 else self.difficulties

    # ---- generation --------------------------------------------------------------------------

    @abc.abstractmethod
    def generate(self, rng: np.random.Generator, difficulty: int) -> Example:
        """One random problem at `difficulty` (its id must identify the problem)."""

    def examples(self, split: str, n: int, *, seed: int, unique: bool | None = None) -> list[Example]:
        """`n` examples of a split, the same list for the same (task, split, n, seed).

        Args:
          split: "train" or "test"; the two never share a problem.
          n: number of examples.
          seed: integer seed.
          unique: no repeated problem in the list (default: True for "test" only).

        Returns:
          list of n Examples; difficulties cycle uniformly at random over `self.difficulties`.

        Raises:
          ValueError: unknown split, or not enough distinct problems for `unique`.
        """
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError(f"n: expected >= 0, got {n}")
        unique = (split == "test") if unique is None else unique
        rng = np.random.default_rng([int(seed), stable_hash(self.name) % 2**32, SPLITS.index(split)])
        out: list[Example] = []
        seen: set[str] = set()
        attempts, max_attempts = 0, 200 * n + 10_000
        while len(out) < n:
            attempts += 1
            if attempts > max_attempts:
                raise ValueError(
                    f"{self.name}: found only {len(out)} of n={n} distinct {split} problems at "
                    f"difficulty {self.difficulty}; ask for fewer or raise the difficulty"
                )
            difficulty = self.difficulties[int(rng.integers(len(self.difficulties)))]
            example = self.generate(rng, difficulty)
            if split_of(example.id, self.test_fraction) != split:
                continue
            if unique:
                if example.id in seen:
                    continue
                seen.add(example.id)
            out.append(example)
        return out

    # ---- worked solutions --------------------------------------------------------------------

    def solution(
        self, example: Example, *, rng, error_rate: float, format_error_rate: float = 0.0
    ) -> tuple[str, bool]:
        """A worked solution, wrong with probability `error_rate`, malformed w.p. `format_error_rate`.

        Default: the thinking is `example.solution` (its think part when it has tags, e.g. the
        GSM8K rationale otherwise; empty without one: the question -> answer pair) and, when
        wrong, a numeric answer is perturbed by +/-1..3 and any other answer gets
        one character edit (`perturb_text`). Synthetic tasks override this with step-by-step
        traces whose steps can be wrong.

        Args:
          example: the problem.
          rng: numpy Generator or int seed.
          error_rate: probability that the answer is wrong.
          format_error_rate: probability that the layout is broken.

        Returns:
          (completion text, whether the completion scores as correct).
        """
        rng = np.random.default_rng(rng)
        check_rate("error_rate", error_rate)
        check_rate("format_error_rate", format_error_rate)
        answer = example.answer
        thinking = extract_thinking(example.solution).strip() if example.solution else ""
        if rng.random() < error_rate:
            value = parse_number(answer)
            if value is None:
                answer = perturb_text(answer, rng)
            else:
                answer = _format_number(value + int(rng.choice([-3, -2, -1, 1, 2, 3])))
        return self.finish_solution(example, thinking, answer, rng, format_error_rate)

    def finish_solution(self, example, thinking, answer, rng, format_error_rate):
        """Lays out (thinking, answer), maybe malformed, and scores it honestly."""
        if rng.random() < format_error_rate:
            text = malform(thinking, answer, rng)
        else:
            text = format_completion(thinking, answer)
        return text, self.is_correct(text, example)

    # ---- scoring -----------------------------------------------------------------------------

    def extract_answer(self, completion: str) -> str | None:
        """The answer inside the last `<answer>...</answer>`, or None."""
        return _extract_answer(completion)

    def check_answer(self, answer: str, example: Example) -> bool:
        """Whether an extracted answer is correct (default: `answers_match` with the reference)."""
        return answers_match(answer, example.answer)

    def is_correct(self, completion: str, example: Example) -> bool:
        """Whether the completion's answer is correct; False on any error."""
        try:
            answer = self.extract_answer(completion)
            return answer is not None and bool(self.check_answer(answer, example))
        except Exception:  # pylint: disable=broad-except
            return False

    def accuracy_reward(self, completion: str, example: Example) -> float:
        """1.0 for a correct answer, else 0.0."""
        return 1.0 if self.is_correct(completion, example) else 0.0

    def reward_fns(self) -> dict[str, Callable[[str, Any], float]]:
        """Named rewards `(completion, example) -> float`: "accuracy", "format" (strict), "format_soft"."""
        return {"accuracy": self.accuracy_reward, "format": strict_format_reward,
                "format_soft": soft_format_reward}

    def score(self, completion: str, example: Example) -> dict[str, float]:
        """Every reward component of `reward_fns()` plus "correct" (0/1)."""
        scores = {name: float(fn(completion, example)) for name, fn in self.reward_fns().items()}
        scores["correct"] = 1.0 if self.is_correct(completion, example) else 0.0
        return scores


def _format_number(value) -> str:
    value = value if not hasattr(value, "denominator") or value.denominator != 1 else value.numerator
    return str(value)


def perturb(value: int, rng: np.random.Generator, *, exclude: Callable[[int], bool] = lambda v: False,
            max_delta: int = 3) -> int | None:
    """`value + delta` for a random delta in +/-1..max_delta with `exclude(result)` False.

    Returns None when every candidate is excluded.
    """
    candidates = [value + d for d in range(-max_delta, max_delta + 1) if d != 0]
    candidates = [c for c in candidates if not exclude(c)]
    if not candidates:
        return None
    return int(candidates[int(rng.integers(len(candidates)))])


def perturb_text(text: str, rng: np.random.Generator) -> str:
    """`text` with one random character edit, never equal to `text`: two neighbouring
    different characters swapped, one character dropped (when more than one) or one doubled.

    The wrong answer of a noisy worked solution for answers that are not numbers ("?" for
    an empty `text`).
    """
    if not text:
        return "?"
    swaps = [i for i in range(len(text) - 1) if text[i] != text[i + 1]]
    edits = ["double"] + (["swap"] if swaps else []) + (["drop"] if len(text) > 1 else [])
    edit = edits[int(rng.integers(len(edits)))]
    if edit == "swap":
        i = swaps[int(rng.integers(len(swaps)))]
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    i = int(rng.integers(len(text)))
    if edit == "drop":
        return text[:i] + text[i + 1:]
    return text[:i] + text[i] * 2 + text[i + 1:]
