"""Accuracy reward: does the extracted answer equal the reference answer?

Numbers are compared exactly as rationals after a tolerant normalisation (thousands commas,
spaces, a leading "+", trailing ".0", "$" signs, "a/b" fractions, short decimal exponents).
Other answers (LaTeX, symbolic) are equal when their normalised strings are, or else when
math-verify (https://github.com/huggingface/Math-Verify) says so: on inputs pre-screened so
that no call can build astronomically large numbers, in a bounded pool of worker processes
(`grpo_jax.rewards.verifier`) with a hard deadline per comparison in the worker's CPU
seconds (so the load of the machine does not change a verdict; calls queue for a worker),
that works from any thread. An undecided comparison (past the deadline, a worker that died
or stopped running, or no worker that can start) scores 0 and is counted
(`verifier_stats()`, `math_verify_timeouts()`); decided
verdicts and timeouts are cached per pair, so the same text gets the same score within a
run.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_jax.rewards import verifier
from grpo_jax.rewards.parsing import extract_answer, last_number

# Longest answer string parsed as a number / passed to math-verify.
MAX_NUMBER_CHARS = 100
MAX_SYMBOLIC_CHARS = 256
# math-verify deadline per comparison (seconds of the worker's CPU time, enforced from the
# calling thread, so a verdict does not depend on the machine's load; `configure_verifier`
# sets it).
MATH_VERIFY_TIMEOUT_SECONDS = 2.0

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


# Two or more letters and nothing else (spaces aside): a word, not an expression. math-verify
# reads "abc" as the product a*b*c, so "cba" would equal it.
_WORDS = re.compile(r"\s*[^\W\d_]{2,}(\s+[^\W\d_]+)*\s*")


def _safe_for_symbolic(text: str) -> bool:
    """Pre-screen: short, no long digit runs, at most one power, no factorial, not words."""
    if _WORDS.fullmatch(text):
        return False
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


def configure_verifier(*, deadline_seconds: float | None = None, workers: int | None = None,
                       wait_seconds: float | None = None, start: bool = False) -> dict:
    """Sets the math-verify pool's limits (process-wide; counts and cached verdicts carry over).

    A symbolic comparison queues for one of `workers` worker processes and gets
    `deadline_seconds` of that worker's CPU time (the kernel ends it there): undecided
    (scored 0, counted in `verifier_stats()`) past it. `start=True` starts the workers now,
    ahead of the first comparison.

    Args:
      deadline_seconds: CPU seconds of one comparison (MATH_VERIFY_TIMEOUT_SECONDS).
      workers: number of worker processes (default 2).
      wait_seconds: a worker holding a comparison that has stopped running (stopped,
        traced, asleep with its CPU clock still) this long is killed and the call is an
        error (a liveness guard, not a bound on a comparison).
      start: start the workers now.

    Returns:
      the settings now in force.
    """
    global MATH_VERIFY_TIMEOUT_SECONDS  # pylint: disable=global-statement
    if deadline_seconds is not None:
        if isinstance(deadline_seconds, bool) or not isinstance(deadline_seconds, (int, float)) \
                or not deadline_seconds > 0:
            raise ValueError(f"deadline_seconds must be a number > 0, got {deadline_seconds!r}")
        MATH_VERIFY_TIMEOUT_SECONDS = float(deadline_seconds)
    pool = verifier.configure(workers=workers, wait_seconds=wait_seconds, start=start)
    return {"deadline_seconds": float(MATH_VERIFY_TIMEOUT_SECONDS), "workers": pool.workers,
            "wait_seconds": pool.wait_seconds, "startup_seconds": pool.startup_seconds}


def verifier_stats() -> dict:
    """Cumulative counts of this process's symbolic comparisons (ints):

    calls = decided + timeouts + timeouts_cached + busy + errors. "decided": a verdict that
    does not depend on timing (math-verify's, or its "cannot parse"); "timeouts": no verdict
    within the deadline (the first time for that pair; the worker was replaced);
    "timeouts_cached": a pair that timed out before (cached for the run, scored 0 again);
    "busy": no worker can be had (shut down, or its last starts failed); "errors": the
    worker died or stopped running mid-call (both
    not cached; the normalised string comparison decided). Also "cache_hits",
    "worker_restarts" and "worker_start_failures". Undecided calls score 0 unless the
    normalised strings are equal.
    """
    return verifier.get_pool().stats()


def undecided_comparisons() -> int:
    """How many symbolic comparisons of this process had no verdict (past the deadline, no
    worker free, a worker that died), each scored 0 unless the normalised strings matched:
    the RL loop logs the count of each step as `reward_undecided`."""
    stats = verifier_stats()
    return sum(stats[k] for k in ("timeouts", "timeouts_cached", "busy", "errors"))


def math_verify_timeouts() -> int:
    """How many math-verify comparisons timed out in this process (each scored 0); the
    first timeout of each pair (`verifier_stats()` has the repeats and the other counts)."""
    return verifier_stats()["timeouts"]


def _math_verify_equal(predicted: str, reference: str):
    """math-verify's verdict: True / False, None (cannot parse, not installed) or one of
    verifier.TIMEOUT / BUSY / ERROR. Cached per pair (see grpo_jax.rewards.verifier)."""
    return verifier.get_pool().compare(predicted, reference, MATH_VERIFY_TIMEOUT_SECONDS)


def _as_latex(text: str) -> str:
    """Wraps bare expressions in $...$ so math-verify's LaTeX extractor sees them."""
    return text if "$" in text or "\\(" in text or "\\[" in text else f"${text}$"


def answers_match(predicted: str | None, reference: str | None, *, symbolic: bool = True) -> bool:
    """Whether a predicted answer equals the reference answer.

    Exact rational comparison when both parse as numbers; otherwise equal if the normalised
    strings are equal or math-verify says so (when `symbolic`, on pre-screened short inputs
    that are not plain words, within the deadline: `configure_verifier`): "cba" does not
    equal "abc", though math-verify reads both as a product of symbols.

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
    if normalize_text(predicted) == normalize_text(reference):
        return True
    return bool(symbolic and _safe_for_symbolic(predicted) and _safe_for_symbolic(reference)
                and _math_verify_equal(predicted, reference) is True)


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
