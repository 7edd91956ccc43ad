"""Rewards on hand-made completions: correct, wrong, malformed, truncated, empty."""

import threading
from fractions import Fraction

import numpy as np
import pytest

from grpo_jax.rewards import (
    accuracy_reward,
    answers_match,
    check_countdown,
    combine,
    countdown_reward,
    countdown_tinyzero_reward,
    extract_answer,
    extract_thinking,
    get_reward_fn,
    language_consistency,
    language_consistency_reward,
    make_language_reward,
    overlong_penalty,
    overlong_reward,
    parse_expression,
    parse_number,
    soft_format_reward,
    strict_format_reward,
)
from grpo_jax.tasks import Example
from grpo_jax.text import CharTokenizer

GOOD = "<think>5*3=15 7+15=22</think><answer>22</answer>"
WRONG = "<think>5*3=15 7+15=23</think><answer>23</answer>"
TRUNCATED = "<think>5*3=15 7+15=22</think><answer>2"
NO_THINK_CLOSE = "<think>5*3=15 7+15=22 <answer>22</answer>"
OUTSIDE = "<think>5*3=15</think>22"
TRAILING = GOOD + " and more"
EXAMPLE = Example(id="a", prompt="7+5*3", answer="22")


@pytest.mark.parametrize("completion,accuracy,strict,soft", [
    (GOOD, 1.0, 1.0, 1.0),
    (WRONG, 0.0, 1.0, 1.0),
    (TRUNCATED, 0.0, 0.0, 0.0),
    (NO_THINK_CLOSE, 1.0, 0.0, 0.0),
    (OUTSIDE, 0.0, 0.0, 0.0),
    (TRAILING, 1.0, 0.0, 1.0),
    ("", 0.0, 0.0, 0.0),
    ("  \n" + GOOD + "\n", 1.0, 1.0, 1.0),
    ("<think>a</think>\n<answer> 22 </answer>", 1.0, 1.0, 1.0),
    ("<think>a</think>x<answer>22</answer>", 1.0, 0.0, 1.0),  # text between blocks
    ("<think>a</think><answer> </answer>", 0.0, 0.0, 1.0),  # empty answer
    ("<think><think>a</think><answer>22</answer>", 1.0, 0.0, 1.0),  # nested tag
    ("<answer>22</answer><think>a</think>", 1.0, 0.0, 0.0),  # wrong order
    ("<think>a</think><answer>1</answer><answer>22</answer>", 1.0, 0.0, 1.0),  # last answer counts
])
def test_hand_made_completions(completion, accuracy, strict, soft):
    assert accuracy_reward(completion, EXAMPLE) == accuracy
    assert strict_format_reward(completion, EXAMPLE) == strict
    assert soft_format_reward(completion) == soft


def test_extract():
    assert extract_answer(GOOD) == "22"
    assert extract_answer(TRUNCATED) is None and extract_answer("") is None
    assert extract_thinking(GOOD) == "5*3=15 7+15=22"
    assert extract_thinking(NO_THINK_CLOSE) == "5*3=15 7+15=22 "
    assert extract_thinking("plain words <answer>1</answer>") == "plain words "


@pytest.mark.parametrize("text,value", [
    ("1,234", Fraction(1234)), (" 12 ", Fraction(12)), ("12.0", Fraction(12)), ("+5", Fraction(5)),
    ("-3", Fraction(-3)), ("3/4", Fraction(3, 4)), ("1.5", Fraction(3, 2)), ("1e3", Fraction(1000)),
    ("$12", Fraction(12)), ("12.", Fraction(12)), ("1 000", Fraction(1000)), ("-1.5/2", Fraction(-3, 4)),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1/0", "1e5000", "1" * 200, "1,23", "1/2/3", "--1", "\\frac{1}{2}"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


@pytest.mark.parametrize("predicted,reference,expected", [
    ("1,234", "1234", True), ("22.0", "22", True), ("0.5", "1/2", True), ("22", "23", False),
    ("\\frac{1}{2}", "0.5", True), ("\\boxed{22}", "22", True), ("x+1", "1+x", True),
    ("\\sqrt{4}", "2", True), ("\\frac{1}{3}", "0.5", False), ("Paris", "paris.", True),
    ("10**10000", "1", False), ("99^99^99", "1", False), ("", "1", False), (None, "1", False),
    # words are text, not products of symbols (math-verify equates "cba" and "abc")
    ("cba", "abc", False), ("olleh", "hello", False), ("world hello", "hello world", False),
    ("Hello", "hello", True), ("2x", "x*2", True),
])
def test_answers_match(predicted, reference, expected):
    assert answers_match(predicted, reference) is expected


def test_answers_match_in_a_thread():
    """Away from the main thread math-verify runs without its signal timeout, still correct."""
    results = []
    thread = threading.Thread(target=lambda: results.append(answers_match("\\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert results == [True]


def test_accuracy_reference_forms():
    assert accuracy_reward(GOOD, "22") == 1.0
    assert accuracy_reward(GOOD, {"answer": "22"}) == 1.0
    assert accuracy_reward(GOOD, object()) == 0.0


def test_language_consistency():
    assert language_consistency("the sum is five") == 1.0
    assert language_consistency("the sum est cinq") == 1.0  # French words are ASCII letters too
    assert language_consistency("the 和 is") == pytest.approx(2 / 3)
    assert language_consistency("5*3=15 7+15=22") == 1.0  # no words: neutral
    assert language_consistency("和和 abc", language="zh") == pytest.approx(2 / 3)
    assert language_consistency("straße ok") == 0.5
    text = "<think>add 两个 numbers</think><answer>3</answer>"
    # thinking part only: "add", "两", "个", "numbers"
    assert language_consistency_reward(text) == 0.5
    assert make_language_reward("zh")(text, None) == 0.5
    with pytest.raises(ValueError, match="unknown 'xx'"):
        make_language_reward("xx")


def test_overlong_penalty_dapo():
    # L_max = 20, L_cache = 4: 0 up to 16, then -1/4 per token, -1 beyond 20.
    lengths = np.array([0, 16, 17, 18, 20, 21, 100])
    expected = np.array([0, 0, -0.25, -0.5, -1, -1, -1], np.float32)
    np.testing.assert_allclose(overlong_penalty(lengths, max_length=20, cache_length=4), expected)
    assert overlong_penalty(18, max_length=20, cache_length=4) == -0.5
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(1, max_length=4, cache_length=5)
    tok = CharTokenizer()
    reward = overlong_reward(max_length=20, cache_length=4, tokenizer=tok)
    # GOOD is 4 tags + 16 characters = 20 tokens but 50 characters
    assert len(tok.encode(GOOD)) == 20 and reward(GOOD, None) == -1.0
    assert reward("<think>ab</think>", None) == 0.0
    assert reward("é" * 18, None) == -0.5  # not encodable: falls back to characters
    assert overlong_reward(max_length=100, cache_length=10)(GOOD, None) == 0.0


def test_combine():
    fn = combine({"accuracy": accuracy_reward, "format": strict_format_reward}, {"format": 0.5})
    assert fn(GOOD, EXAMPLE) == (1.5, {"accuracy": 1.0, "format": 1.0})
    assert fn(WRONG, EXAMPLE) == (0.5, {"accuracy": 0.0, "format": 1.0})
    assert fn("", EXAMPLE) == (0.0, {"accuracy": 0.0, "format": 0.0})
    with pytest.raises(ValueError, match=r"unknown rewards \['lenght'\]"):
        combine({"length": accuracy_reward}, {"lenght": 1.0})
    with pytest.raises(ValueError, match="returned nan"):
        combine({"bad": lambda c, e: float("nan")})("x", None)


def test_expression_evaluator():
    assert parse_expression("(3+5)*2") == (Fraction(16), [3, 5, 2])
    assert parse_expression("7/2") == (Fraction(7, 2), [7, 2])
    assert parse_expression("3 x 4 = 12") == (Fraction(12), [3, 4])
    assert parse_expression("-3+5") == (Fraction(2), [3, 5])
    for bad in ["1/0", "1/(2-2)", "2**3", "7//2", "__import__('os')", "a+1", "1.5+2", "[1]",
                "(" * 100 + "1" + ")" * 100, "1+" * 40 + "1", "99999999999*99999999999", "", "True+1"]:
        assert parse_expression(bad) is None, bad


def test_countdown_scoring():
    example = Example(id="c", prompt="Use 3 4 5 to make 17", answer="3*4+5",
                      meta={"numbers": [3, 4, 5], "target": 17})
    assert check_countdown("4*3+5", [3, 4, 5], 17)
    assert not check_countdown("3*4+5+0", [3, 4, 5], 17)  # 0 is not a given number
    assert not check_countdown("3*4+5", [3, 4, 5, 5], 17)  # a number left unused
    assert not check_countdown("3*4*5", [3, 4, 5], 17)
    assert check_countdown("(4*5-3)/1", [1, 3, 4, 5], 17)
    cases = {
        "<think>x</think><answer>5+3*4</answer>": (1.0, 1.0),
        "<think>x</think><answer>5+3+4</answer>": (0.0, 0.1),
        "<think>x</think><answer>1/0</answer>": (0.0, 0.1),
        "<think>x</think><answer>3*4+5": (0.0, 0.0),
        "": (0.0, 0.0),
    }
    for completion, (binary, tinyzero) in cases.items():
        assert countdown_reward(completion, example) == binary
        assert countdown_tinyzero_reward(completion, example) == tinyzero
    assert countdown_reward("<answer>5+3*4</answer>", Example(id="x", prompt="", answer="")) == 0.0


def test_get_reward_fn():
    assert get_reward_fn("format")(GOOD, None) == 1.0
    assert get_reward_fn("overlong", max_length=10, cache_length=5)(GOOD, None) == -1.0
    with pytest.raises(ValueError, match="unknown reward 'x'"):
        get_reward_fn("x")


def test_math_verify_timeout_works_in_any_thread_and_scores_zero(monkeypatch):
    """The same completion gets the same score in the main thread and in a worker thread,
    and a comparison past the timeout scores 0 and is counted (also off the main thread)."""
    import threading

    from grpo_jax.rewards import accuracy

    def in_thread(fn):
        out = []
        thread = threading.Thread(target=lambda: out.append(fn()))
        thread.start()
        thread.join()
        return out[0]

    pair = (r"\frac{6}{8}", r"\frac{3}{4}")
    assert accuracy.answers_match(*pair) is True
    assert in_thread(lambda: accuracy.answers_match(r"\frac{9}{12}", r"\frac{3}{4}")) is True
    before = accuracy.math_verify_timeouts()
    monkeypatch.setattr(accuracy, "MATH_VERIFY_TIMEOUT_SECONDS", 0.0)
    assert in_thread(lambda: accuracy.answers_match(r"\frac{12}{16}", r"\frac{3}{4}")) is False
    assert accuracy.math_verify_timeouts() == before + 1
    monkeypatch.setattr(accuracy, "MATH_VERIFY_TIMEOUT_SECONDS", 2)
    # Verdicts are cached: the timed-out pair keeps its score; a new pair works again.
    assert accuracy.answers_match(r"\frac{12}{16}", r"\frac{3}{4}") is False
    assert accuracy.answers_match(r"\frac{15}{20}", r"\frac{3}{4}") is True
