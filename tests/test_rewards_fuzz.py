"""Every reward returns a finite float for any string and never raises (hypothesis fuzzing)."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_jax.rewards import (
    accuracy_reward,
    answers_match,
    combine,
    countdown_reward,
    countdown_tinyzero_reward,
    language_consistency_reward,
    overlong_reward,
    parse_expression,
    parse_number,
    soft_format_reward,
    strict_format_reward,
)
from grpo_jax.tasks import Example, get_task
from grpo_jax.text import CharTokenizer

TAGS = ["<think>", "</think>", "<answer>", "</answer>", "<think", "answer>", "</"]
NUMBERS = ["10**10000", "1" + "0" * 10000, "-0", "1e999999", "1/0", "0/0", "nan", "inf", "-inf",
           "9" * 400, "\\frac{1}{0}", "10^{10^{10}}", "99!", "(" * 300, "1,234,567.890", "3*4+5"]

pieces = st.one_of(st.sampled_from(TAGS), st.sampled_from(NUMBERS), st.text(max_size=20))
completions = st.one_of(
    st.text(),
    st.lists(pieces, max_size=30).map("".join),
    st.builds(lambda inner: f"<think>x</think><answer>{inner}</answer>", st.one_of(
        st.sampled_from(NUMBERS), st.text(max_size=40), st.lists(pieces, max_size=5).map("".join))),
)

ARITHMETIC = get_task("arithmetic")
COUNTDOWN = get_task("countdown")
EXAMPLES = {
    "arithmetic": ARITHMETIC.examples("train", 1, seed=0)[0],
    "countdown": COUNTDOWN.examples("train", 1, seed=0)[0],
}
SYMBOLIC = Example(id="s", prompt="?", answer="\\frac{1}{2}")
OVERLONG = overlong_reward(max_length=64, cache_length=16, tokenizer=CharTokenizer())
ALL = combine({
    "accuracy": accuracy_reward, "format": strict_format_reward, "format_soft": soft_format_reward,
    "language": language_consistency_reward, "overlong": OVERLONG,
})


def _all_rewards(completion):
    values = [
        accuracy_reward(completion, EXAMPLES["arithmetic"]),
        accuracy_reward(completion, SYMBOLIC),
        strict_format_reward(completion),
        soft_format_reward(completion),
        language_consistency_reward(completion),
        OVERLONG(completion, None),
        countdown_reward(completion, EXAMPLES["countdown"]),
        countdown_tinyzero_reward(completion, EXAMPLES["countdown"]),
        *ARITHMETIC.score(completion, EXAMPLES["arithmetic"]).values(),
        *COUNTDOWN.score(completion, EXAMPLES["countdown"]).values(),
        *ALL(completion, EXAMPLES["arithmetic"])[1].values(),
        ALL(completion, EXAMPLES["arithmetic"])[0],
    ]
    for value in values:
        assert isinstance(value, float) and math.isfinite(value)
    return values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions)
def test_rewards_finite_on_any_string(completion):
    _all_rewards(completion)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=60), st.sampled_from(NUMBERS)),
       st.one_of(st.text(max_size=60), st.sampled_from(NUMBERS)))
def test_answer_helpers_never_raise(predicted, reference):
    assert isinstance(answers_match(predicted, reference), bool)
    parse_number(predicted)
    parse_expression(predicted)


def test_adversarial_inputs():
    megabyte = 1 << 20
    cases = [
        "a" * megabyte,
        "<think>" * (megabyte // 7),
        "<think>" + "x " * (megabyte // 2) + "</think><answer>22</answer>",
        "<think>1</think><answer>" + "9" * megabyte + "</answer>",
        "<answer>" * 50_000 + "</answer>" * 50_000,
        "<think>1</think><answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>",
        "<think>1</think><answer>" + "1+" * 50_000 + "1</answer>",
        "<think>1</think><answer>10**10**10</answer>",
        "<think>1</think><answer>\\frac{" * 1000 + "</answer>",
        "\x00\ud7ff\U0010ffff" * 1000,
    ]
    for completion in cases:
        _all_rewards(completion)
    assert strict_format_reward(cases[2]) == 1.0
    assert accuracy_reward(cases[2], EXAMPLES["arithmetic"]) in (0.0, 1.0)
