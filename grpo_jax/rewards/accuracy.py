"""Accuracy reward: does the extracted answer equal the reference answer?

Numbers are compared exactly as rationals after a tolerant normalisation (thousands commas,
spaces, a leading "+", trailing ".0", "$" signs, "a/b" fractions, short decimal exponents).
Other answers (LaTeX, symbolic) go through math-verify
(https://github.com/huggingface/Math-Verify) with a timeout in the main thread, on inputs
pre-screened so that no call can build astronomically large numbers; when math-verify is
unavailable, errors or times out, a normalised string comparison decides.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

from grpo_jax.rewards.parsing import extract_answer

# Longest answer string parsed as a number / passed to math-verify.
MAX_NUMBER_CHARS = 100
MAX_SYMBOLIC_CHARS = 256
# math-verify timeout (seconds; signal based, so main thread only).
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


def _math_verify_equal(predicted: str, reference: str) -> bool | None:
    """math-verify equality, or None when it cannot decide (missing, error, timeout)."""
    try:
        import math_verify  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    in_main_thread = threading.current_thread() is threading.main_thread()
    timeout = MATH_VERIFY_TIMEOUT_SECONDS if in_main_thread else None
    logger = logging.getLogger("math_verify")
    level = logger.level
    logger.setLevel(logging.ERROR)  # it warns once when the timeout is off
    try:
        gold = math_verify.parse(_as_latex(reference), parsing_timeout=timeout)
        target = math_verify.parse(_as_latex(predicted), parsing_timeout=timeout)
        if not gold or not target:
            return None
        return bool(math_verify.verify(gold, target, timeout_seconds=timeout))
    except Exception:  # pylint: disable=broad-except
        return None
    finally:
        logger.setLevel(level)


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
        if _math_verify_equal(predicted, reference):
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
