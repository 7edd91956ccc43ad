"""Language-consistency reward of DeepSeek-R1 (https://arxiv.org/abs/2501.12948, sec. 2.3.2).

    r_lang = (# words of the target language in the thinking part) / (# words there)

A word is a run of letters (Unicode); each CJK ideograph counts as one word. Digits,
operators and punctuation are not words, so they are neutral. A thinking part with no words
scores 1.0 (nothing in another language).
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from grpo_jax.rewards.parsing import extract_thinking

# Only this many characters of the thinking part are inspected (bounds the work).
MAX_LANGUAGE_CHARS = 200_000

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\W\d_{_CJK}]+")
_ASCII_WORD = re.compile(r"[A-Za-z]+")
_CJK_CHAR = re.compile(rf"[{_CJK}]")

LANGUAGES: dict[str, Callable[[str], bool]] = {
    "en": lambda word: _ASCII_WORD.fullmatch(word) is not None,
    "zh": lambda word: _CJK_CHAR.fullmatch(word) is not None,
}


def language_consistency(text: str, *, language: str | Callable[[str], bool] = "en") -> float:
    """Share of words of `text` that belong to `language`.

    Args:
      text: the text to inspect (e.g. the thinking part).
      language: "en" (ASCII-letter words), "zh" (CJK ideographs) or a predicate word -> bool.

    Returns:
      a float in [0, 1]; 1.0 when `text` has no words.

    Raises:
      ValueError: unknown language name.
    """
    if callable(language):
        is_target = language
    elif language in LANGUAGES:
        is_target = LANGUAGES[language]
    else:
        raise ValueError(f"language: unknown {language!r}; expected one of {sorted(LANGUAGES)} "
                         "or a callable word -> bool")
    if not isinstance(text, str):
        return 1.0
    words = _WORD.findall(text[:MAX_LANGUAGE_CHARS])
    if not words:
        return 1.0
    return sum(1 for word in words if is_target(word)) / len(words)


def language_consistency_reward(completion: str, example=None, *, language="en") -> float:
    """Language consistency of the thinking part of `completion` (see module docstring).

    Args:
      completion: the generated text.
      example: unused.
      language: target language, as in `language_consistency`.

    Returns:
      a float in [0, 1].
    """
    del example
    try:
        return float(language_consistency(extract_thinking(completion), language=language))
    except ValueError:
        raise
    except Exception:  # pylint: disable=broad-except
        return 0.0


def make_language_reward(language="en"):
    """`language_consistency_reward` bound to a target language (checked now, not per call)."""
    language_consistency("", language=language)
    return functools.partial(language_consistency_reward, language=language)
