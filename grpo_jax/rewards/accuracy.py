"""Accuracy reward: does the extracted answer equal the reference answer?

Numbers are compared exactly as rationals after a tolerant normalisation (thousands commas,
spaces, a leading "+", trailing ".0", "$" signs, "a/b" fractions, short decimal exponents).
Other answers (LaTeX, symbolic) go through math-verify
(https://github.com/huggingface/Math-Verify) in a worker process with a wall-clock timeout
that works from any thread, on inputs pre-screened so that no call can build astronomically
large numbers; a timeout scores 0 (and is counted: `math_verify_timeouts()`); when
math-verify is unavailable or errors, a normalised string comparison decides.
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction

from grpo_jax.rewards.parsing import extract_answer, last_number

# Longest answer string parsed as a number / passed to math-verify.
MAX_NUMBER_CHARS = 100
MAX_SYMBOLIC_CHARS = 256
# math-verify timeout (seconds of wall clock, enforced from the calling thread).
MATH_VERIFY_TIMEOUT_SECONDS = 2

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_LONG_DIGIT_RUN = re.compile(r"\d{31,}")
_WHITESPACE = re.compile(r"\s+")


def parse_number(text: str) -> Fraction | None:
    """Parses a number written in a tolerant way into an exact rational.

    Accepts "1,234", " 12 ", "12.0", "+5", "-3", "3/4", "-1.5/2", "1e3", "$12", "12." and
    returns None for anything else (including strings over MAX_NUMBER_CHARS characters and
    exponents beyond 3 digits, which bounds the size of the result).

    Args:
      text: the candidate number.

    Returns:
      Fraction, or None when `text` is not a plain number.
    """
    if not isinstance(text, str) or len(text) > MAX_NUMBER_CHARS:
        return None
    text = text.strip().strip("$").replace("\\$", "").strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    text = _WHITESPACE.sub("", text)
    if not text:
        return None
    if "/" in text:
        parts = text.split("/")
        if len(parts) != 2:
            return None
        numerator, denominator = parse_number(parts[0]), parse_number(parts[1])
        if numerator is None or denominator is None or denominator == 0:
            return None
        return numerator / denominator
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def normalize_text(text: str) -> str:
    """Lower-cases, collapses whitespace, strips "$", surrounding spaces and a final period.

    Args:
      text: an answer string.

    Returns:
      normalised string.
    """
    text = _WHITESPACE.sub(" ", str(text)[: 4 * MAX_SYMBOLIC_CHARS]).strip().lower()
    text = text.strip("$").strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def _safe_for_symbolic(text: str) -> bool:
    """Pre-screen: short, no long digit runs, at most one power, no factorial."""
    if len(text) > MAX_SYMBOLIC_CHARS or _LONG_DIGIT_RUN.search(text):
        return False
    if "!" in text:
        return False
    powers = text.count("^") + text.count("**")
    if powers > 1:
        return False
    if powers == 1 and re.search(r"\d{4,}", text):
        return False
    return True


_TIMED_OUT = "timeout"


class _MathVerifyWorker:
    """One worker process for math-verify (grpo_jax/rewards/math_verify_worker.py), so its
    timeout is a wall-clock wait on a pipe that works in any thread (math-verify's own
    timeout is a SIGALRM: main thread only). A call past the timeout kills the worker (a new
    one starts on the next call) and counts as a timeout."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process = None
        self.timeouts = 0
        self.calls = 0

    def _start(self) -> None:
        import subprocess  # pylint: disable=import-outside-toplevel
        import sys  # pylint: disable=import-outside-toplevel

        self._process = subprocess.Popen(
            [sys.executable, "-m", "grpo_jax.rewards.math_verify_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.calls = 0

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=5)
        self._process = None

    def compare(self, predicted: str, reference: str, timeout: float):
        import json  # pylint: disable=import-outside-toplevel
        import select  # pylint: disable=import-outside-toplevel

        with self._lock:
            try:
                if self._process is None or self._process.poll() is not None:
                    self._start()
                self._process.stdin.write(json.dumps([predicted, reference]) + "\n")
                self._process.stdin.flush()
                # The first call also waits for the worker to import math-verify.
                wait = timeout + (60.0 if self.calls == 0 else 0.0)
                ready, _, _ = select.select([self._process.stdout], [], [], wait)
                if ready:
                    self.calls += 1
                    return json.loads(self._process.stdout.readline())
            except (OSError, ValueError):  # the worker died: undecided, restart next time
                self._stop()
                return None
            self._stop()
            self.timeouts += 1
            return _TIMED_OUT


_WORKER = _MathVerifyWorker()


def math_verify_timeouts() -> int:
    """How many math-verify comparisons timed out in this process (each scored 0)."""
    return _WORKER.timeouts


@functools.lru_cache(maxsize=65536)
def _math_verify_equal(predicted: str, reference: str):
    """math-verify equality (True / False), None when it cannot decide (missing or error),
    or "timeout" (scored as no match). Cached: the same pair always gets the same verdict,
    in any thread."""
    return _WORKER.compare(predicted, reference, MATH_VERIFY_TIMEOUT_SECONDS)


def _as_latex(text: str) -> str:
    """Wraps bare expressions in $...$ so math-verify's LaTeX extractor sees them."""
    return text if "$" in text or "\\(" in text or "\\[" in text else f"${text}$"


def answers_match(predicted: str | None, reference: str | None, *, symbolic: bool = True) -> bool:
    """Whether a predicted answer equals the reference answer.

    Exact rational comparison when both parse as numbers; otherwise equal if math-verify
    (when `symbolic`, on pre-screened short inputs) or normalised string equality says so.

    Args:
      predicted: the model's answer (e.g. from `extract_answer`), or None.
      reference: the reference answer.
      symbolic: allow the math-verify path.

    Returns:
      True when they match; False for None/empty inputs. Never raises.
    """
    if not isinstance(predicted, str) or not isinstance(reference, str):
        return False
    if not predicted.strip() or not reference.strip():
        return False
    predicted_number, reference_number = parse_number(predicted), parse_number(reference)
    if predicted_number is not None and reference_number is not None:
        return predicted_number == reference_number
    if symbolic and _safe_for_symbolic(predicted) and _safe_for_symbolic(reference):
        verdict = _math_verify_equal(predicted, reference)
        if verdict == _TIMED_OUT:
            return False
        if verdict:
            return True
    return normalize_text(predicted) == normalize_text(reference)


def _reference_of(example) -> str | None:
    if isinstance(example, str):
        return example
    reference = getattr(example, "answer", None)
    if reference is None and isinstance(example, dict):
        reference = example.get("answer")
    return reference if isinstance(reference, str) else None


def accuracy_reward(completion: str, example) -> float:
    """1.0 if the answer in the last `<answer>...</answer>` matches the reference, else 0.0.

    Args:
      completion: the generated text.
      example: an Example (its `answer` field is the reference), a dict with "answer", or
        the reference string itself.

    Returns:
      1.0 or 0.0; 0.0 when there is no closed answer tag.
    """
    try:
        return 1.0 if answers_match(extract_answer(completion), _reference_of(example)) else 0.0
    except Exception:  # pylint: disable=broad-except
        return 0.0


def lenient_accuracy_reward(completion: str, example) -> float:
    """1.0 if the last number anywhere in the completion equals the reference, else 0.0.

    The lenient reading of GSM8K-style evaluations (no required tags); reported next to the
    strict `accuracy_reward`, since published figures differ by tens of points between the
    two readings.
    """
    try:
        return 1.0 if answers_match(last_number(completion), _reference_of(example),
                                    symbolic=False) else 0.0
    except Exception:  # pylint: disable=broad-except
        return 0.0
