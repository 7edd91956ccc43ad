"""Splitting a completion into its thinking and answer parts.

All helpers use `str.find` / `str.rfind` (linear time, no backtracking), so they are cheap on
any input, including megabyte-long strings, and never raise.
"""

from __future__ import annotations

import re

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# Completions longer than this are treated as malformed by the parsers below: no sensible
# completion is this long, and it bounds the work on adversarial input.
MAX_COMPLETION_CHARS = 4_000_000


def _as_text(completion) -> str | None:
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    return completion


def extract_answer(completion: str) -> str | None:
    """Text inside the last complete `<answer>...</answer>` pair, stripped; None if absent.

    Args:
      completion: the generated text (the prompt excluded).

    Returns:
      the answer string, or None when there is no closed answer tag pair.
    """
    text = _as_text(completion)
    if text is None:
        return None
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


# A number as written in text: optional sign and "$", thousands commas, decimals.
_NUMBER_IN_TEXT = re.compile(r"-?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\$?\d+(?:\.\d+)?|-?\$?\.\d+")
MAX_NUMBER_SCAN_CHARS = 20_000  # the last number is searched in the completion's tail


def last_number(completion: str) -> str | None:
    """The last number written anywhere in the completion ("1,200", "-3.5", "$18"), with
    "$" and thousands commas removed; None when there is none.

    Scans at most the last MAX_NUMBER_SCAN_CHARS characters (linear time).
    """
    text = _as_text(completion)
    if text is None:
        return None
    found = None
    for found in _NUMBER_IN_TEXT.finditer(text[-MAX_NUMBER_SCAN_CHARS:]):
        pass
    if found is None:
        return None
    return found.group(0).replace("$", "").replace(",", "")


def extract_thinking(completion: str) -> str:
    """The reasoning part: text after the first `<think>` up to `</think>` (or `<answer>`, or end).

    Without a `<think>` tag, the text before the first `<answer>` (or all of it).

    Args:
      completion: the generated text.

    Returns:
      the thinking text (possibly empty).
    """
    text = _as_text(completion)
    if text is None:
        return ""
    start = text.find(THINK_OPEN)
    start = 0 if start < 0 else start + len(THINK_OPEN)
    end = len(text)
    for tag in (THINK_CLOSE, ANSWER_OPEN):
        position = text.find(tag, start)
        if 0 <= position < end:
            end = position
    return text[start:end]
