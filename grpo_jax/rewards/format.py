"""Format rewards for the `<think>...</think><answer>...</answer>` layout of DeepSeek-R1-Zero.

DeepSeek-R1 (https://arxiv.org/abs/2501.12948) rewards a completion that puts its reasoning
between think tags and its answer between answer tags. Two versions:

* strict: the completion is exactly `<think>T</think><answer>A</answer>` (whitespace allowed
  around and between the blocks), each tag exactly once, A non-empty, nothing after.
* soft: the four tags appear, in order, anywhere in the completion.
"""

from __future__ import annotations

from grpo_jax.rewards.parsing import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    _as_text,
)


def is_strict_format(completion: str) -> bool:
    """Whether `completion` is exactly `<think>T</think><answer>A</answer>` (A non-empty).

    Args:
      completion: the generated text.

    Returns:
      True when the layout is exact (surrounding whitespace allowed).
    """
    text = _as_text(completion)
    if text is None:
        return False
    text = text.strip()
    if any(text.count(tag) != 1 for tag in TAGS):
        return False
    if not (text.startswith(THINK_OPEN) and text.endswith(ANSWER_CLOSE)):
        return False
    think_close = text.find(THINK_CLOSE)
    answer_open = text.find(ANSWER_OPEN)
    if not think_close < answer_open:
        return False
    if text[think_close + len(THINK_CLOSE) : answer_open].strip():
        return False
    answer = text[answer_open + len(ANSWER_OPEN) : -len(ANSWER_CLOSE)]
    return bool(answer.strip())


def has_tags_in_order(completion: str) -> bool:
    """Whether `<think>`, `</think>`, `<answer>`, `</answer>` occur in this order.

    Args:
      completion: the generated text.

    Returns:
      True when each tag is found after the previous one.
    """
    text = _as_text(completion)
    if text is None:
        return False
    position = 0
    for tag in TAGS:
        found = text.find(tag, position)
        if found < 0:
            return False
        position = found + len(tag)
    return True


def strict_format_reward(completion: str, example=None) -> float:
    """1.0 if the completion is exactly `<think>T</think><answer>A</answer>`, else 0.0.

    Args:
      completion: the generated text.
      example: unused (kept for the reward signature `(completion, example) -> float`).

    Returns:
      1.0 or 0.0.
    """
    del example
    return 1.0 if is_strict_format(completion) else 0.0


def soft_format_reward(completion: str, example=None) -> float:
    """1.0 if the four think/answer tags occur in order anywhere in the completion, else 0.0.

    Args:
      completion: the generated text.
      example: unused.

    Returns:
      1.0 or 0.0.
    """
    del example
    return 1.0 if has_tags_in_order(completion) else 0.0
