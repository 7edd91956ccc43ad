"""Rule-based rewards over decoded text: `fn(completion, example) -> float`.

Every reward here returns a finite float for any string and never raises.
"""

from grpo_jax.rewards.accuracy import accuracy_reward, answers_match, normalize_text, parse_number
from grpo_jax.rewards.combine import combine
from grpo_jax.rewards.expression import (
    check_countdown,
    countdown_reward,
    countdown_tinyzero_reward,
    parse_expression,
)
from grpo_jax.rewards.format import (
    has_tags_in_order,
    is_strict_format,
    soft_format_reward,
    strict_format_reward,
)
from grpo_jax.rewards.language import (
    language_consistency,
    language_consistency_reward,
    make_language_reward,
)
from grpo_jax.rewards.length import overlong_penalty, overlong_reward
from grpo_jax.rewards.parsing import extract_answer, extract_thinking


def get_reward_fn(name: str, **kwargs):
    """A built-in reward function by name.

    Names: "accuracy", "format" (strict), "format_soft", "language" (kwargs: language),
    "overlong" (kwargs: max_length, cache_length, tokenizer), "countdown",
    "countdown_tinyzero" (kwargs: format_score, correct_score).

    Args:
      name: reward name.
      **kwargs: options of that reward.

    Returns:
      function (completion, example) -> float.

    Raises:
      ValueError: unknown name.
    """
    import functools  # pylint: disable=import-outside-toplevel

    simple = {
        "accuracy": accuracy_reward,
        "format": strict_format_reward,
        "format_soft": soft_format_reward,
        "countdown": countdown_reward,
    }
    if name in simple:
        if kwargs:
            raise ValueError(f"reward {name!r} takes no options, got {sorted(kwargs)}")
        return simple[name]
    if name == "language":
        return make_language_reward(**kwargs)
    if name == "overlong":
        return overlong_reward(**kwargs)
    if name == "countdown_tinyzero":
        return functools.partial(countdown_tinyzero_reward, **kwargs)
    raise ValueError(f"unknown reward {name!r}; available: accuracy, format, format_soft, "
                     "language, overlong, countdown, countdown_tinyzero")


__all__ = [
    "accuracy_reward",
    "answers_match",
    "check_countdown",
    "combine",
    "countdown_reward",
    "countdown_tinyzero_reward",
    "extract_answer",
    "extract_thinking",
    "get_reward_fn",
    "has_tags_in_order",
    "is_strict_format",
    "language_consistency",
    "language_consistency_reward",
    "make_language_reward",
    "normalize_text",
    "overlong_penalty",
    "overlong_reward",
    "parse_expression",
    "parse_number",
    "soft_format_reward",
    "strict_format_reward",
]
