"""Tasks: registry, templates, determinism, disjoint splits, noisy solutions."""

import hashlib
import math

import numpy as np
import pytest

from grpo_jax.rewards import check_countdown
from grpo_jax.tasks import (
    Example,
    Task,
    apply_template,
    available_tasks,
    format_completion,
    get_task,
    register_task,
)
from grpo_jax.tasks.arithmetic import ArithmeticTask, evaluate
from grpo_jax.tasks.countdown import plan_expression, run_plan

TASKS = ["arithmetic", "countdown"]


def test_registry():
    assert {"arithmetic", "countdown"} <= set(available_tasks())
    assert isinstance(get_task("arithmetic", difficulty=2), ArithmeticTask)
    with pytest.raises(ValueError, match=r"unknown task 'nope'; available: \[.*'arithmetic'"):
        get_task("nope")
    with pytest.raises(ValueError, match="bad arguments"):
        get_task("arithmetic", colour="red")


def test_custom_task_in_one_file():
    @register_task("test_double")
    class Double(Task):
        def generate(self, rng, difficulty):
            x = int(rng.integers(1, 10 ** difficulty))
            return Example(id=f"double:{x}", prompt=f"2*{x}", answer=str(2 * x), difficulty=difficulty)

    task = get_task("test_double", difficulty=2)
    assert task.name == "test_double"
    train = task.examples("train", 20, seed=0)
    test = task.examples("test", 5, seed=0)
    assert not {e.id for e in train} & {e.id for e in test}
    example = train[0]
    assert task.score(format_completion("", example.answer), example) == {
        "accuracy": 1.0, "format": 1.0, "format_soft": 1.0, "correct": 1.0}
    text, correct = task.solution(example, rng=0, error_rate=1.0)
    assert not correct and task.score(text, example)["accuracy"] == 0.0
    # the default noisy solution keeps a given rationale as the thinking part
    gsm = Example(id="g", prompt="q", answer="1,000", solution="10*100 = 1000")
    assert task.solution(gsm, rng=0, error_rate=0.0) == (
        "<think>10*100 = 1000</think><answer>1,000</answer>", True)
    text, correct = task.solution(gsm, rng=0, error_rate=1.0)
    assert not correct and text.startswith("<think>10*100 = 1000</think><answer>")
    assert 997 <= int(task.extract_answer(text)) <= 1003
    with pytest.raises(ValueError, match="already registered"):
        register_task("arithmetic")(Double)


def test_templates():
    example = Example(id="x", prompt="7+5*3", answer="22")
    assert apply_template(example, "plain") == "Q: 7+5*3\nA: "
    prompt = apply_template("What is {x}?", "r1_zero")
    assert "What is {x}?" in prompt and prompt.endswith("Assistant:")
    assert prompt.index("<think>") < prompt.index("</think>") < prompt.index("<answer>")
    assert prompt.index("User:") < prompt.index("Assistant:")
    assert apply_template("q", "Question: {question}\n") == "Question: q\n"
    assert format_completion("t", "a") == "<think>t</think><answer>a</answer>"
    with pytest.raises(ValueError, match="unknown 'fancy'"):
        apply_template("q", "fancy")


@pytest.mark.parametrize("name", TASKS)
def test_examples_deterministic_and_splits_disjoint(name):
    task = get_task(name, difficulty=(1, 2))
    a = task.examples("train", 300, seed=7)
    assert a == task.examples("train", 300, seed=7)
    assert a != task.examples("train", 300, seed=8)
    test = task.examples("test", 100, seed=7)
    assert len({e.id for e in test}) == 100  # test problems are unique
    assert not {e.id for e in a} & {e.id for e in test}
    # another seed of the test split never meets the train split either
    assert not {e.id for e in task.examples("test", 50, seed=99)} & {e.id for e in a}
    assert {e.difficulty for e in a} == {1, 2}
    with pytest.raises(ValueError, match="split"):
        task.examples("validation", 1, seed=0)


@pytest.mark.parametrize("name", TASKS)
def test_reference_solutions_score_correct(name):
    task = get_task(name, difficulty=(1, 2, 3, 4))
    for example in task.examples("train", 200, seed=1):
        assert task.score(example.solution, example)["accuracy"] == 1.0
        text, correct = task.solution(example, rng=0, error_rate=0.0)
        assert correct and text == example.solution
        assert task.extract_answer(text) == example.answer


def test_arithmetic_by_hand():
    task = ArithmeticTask()
    assert evaluate([7, 5, 3], ["+", "*"]) == 22
    assert evaluate([2, 3, 4, 5], ["*", "-", "*"]) == -14
    example = Example(id="a", prompt="7+5*3", answer="22",
                      meta={"operands": [7, 5, 3], "operators": ["+", "*"]})
    text, correct = task.solution(example, rng=0, error_rate=0.0)
    assert text == "<think>5*3=15 7+15=22</think><answer>22</answer>" and correct
    example = task.examples("train", 1, seed=0)[0]
    assert str(evaluate(example.meta["operands"], example.meta["operators"])) == example.answer
    assert example.prompt.replace("*", "").replace("+", "").replace("-", "").isdigit()


def test_arithmetic_levels():
    for difficulty, (low, high, largest) in [(1, (2, 3, 9)), (3, (4, 5, 50))]:
        for example in get_task("arithmetic", difficulty=difficulty).examples("train", 200, seed=0):
            assert low <= example.meta["steps"] <= high
            assert max(example.meta["operands"]) <= largest


def _steps_consistent(thinking):
    """Each written step a op b = r uses the previous results; returns the wrong-step count."""
    wrong = 0
    for step in thinking.split():
        lhs, rhs = step.rsplit("=", 1)
        for op in "+*-":
            head, sep, tail = lhs[1:].partition(op)  # skip a leading minus sign
            if sep:
                a, b = int(lhs[0] + head), int(tail)
                break
        true = {"+": a + b, "-": a - b, "*": a * b}[op]
        wrong += int(rhs) != true
        assert abs(int(rhs) - true) <= 3
    return wrong


@pytest.mark.parametrize("error_rate", [0.1, 0.3])
def test_arithmetic_error_rate_matches_closed_form(error_rate):
    """P(correct) = (1 - e)^steps; wrong answer iff a wrong step; errors are +/-1..3."""
    task = get_task("arithmetic", difficulty=1)
    rng = np.random.default_rng(0)
    examples = task.examples("train", 1500, seed=2)
    correct, expected = 0, 0.0
    for example in examples:
        text, is_correct = task.solution(example, rng=rng, error_rate=error_rate)
        thinking = text[len("<think>"): text.index("</think>")]
        wrong_steps = _steps_consistent(thinking)
        assert is_correct == (wrong_steps == 0) == (task.extract_answer(text) == example.answer)
        correct += is_correct
        expected += (1 - error_rate) ** example.meta["steps"]
    n = len(examples)
    sigma = math.sqrt(expected * (1 - expected / n))
    assert abs(correct - expected) < 4 * sigma, (correct, expected)


def test_format_error_rate():
    task = get_task("arithmetic")
    rng = np.random.default_rng(1)
    examples = task.examples("train", 1000, seed=0)
    results = [task.solution(e, rng=rng, error_rate=0.0, format_error_rate=0.3) for e in examples]
    malformed = [not task.score(t, e)["format"] for (t, _), e in zip(results, examples)]
    assert abs(np.mean(malformed) - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 1000)
    for (text, correct), bad in zip(results, malformed):
        assert correct == (not bad)  # a malformed trace has no closed answer tag


def test_countdown_by_hand():
    numbers, plan = [3, 4, 5], [[0, 1], [3, 2]]
    assert run_plan(numbers, plan, ["*", "+"]) == [12, 17]
    assert plan_expression(numbers, plan, ["*", "+"]) == "3*4+5"
    assert plan_expression(numbers, plan, ["+", "*"]) == "(3+4)*5"
    assert plan_expression([8, 2, 4], [[1, 2], [0, 3]], ["-", "-"]) == "8-(2-4)"
    assert plan_expression([8, 2, 4], [[1, 2], [0, 3]], ["*", "/"]) == "8/(2*4)"
    assert run_plan([3, 4, 5], [[0, 1], [2, 3]], ["-", "/"]) == [-1, -5]
    assert run_plan([3, 3, 5], [[0, 1], [2, 3]], ["-", "/"]) is None  # 5/(3-3)
    assert run_plan([3, 4, 5], [[0, 1], [2, 3]], ["+", "/"]) is None  # 5/7 is not an integer
    task = get_task("countdown")
    example = task.examples("train", 1, seed=0)[0]
    assert example.prompt == f"Use {' '.join(map(str, example.meta['numbers']))} to make {example.meta['target']}"
    assert check_countdown(example.answer, example.meta["numbers"], example.meta["target"])


@pytest.mark.parametrize("difficulty", [1, 2, 4])
def test_countdown_levels_and_validity(difficulty):
    task = get_task("countdown", difficulty=difficulty)
    count, largest = task.level(difficulty)
    for example in task.examples("train", 100, seed=difficulty):
        numbers, target = example.meta["numbers"], example.meta["target"]
        assert len(numbers) == count and max(numbers) <= largest and 1 <= target <= 100
        assert check_countdown(example.answer, numbers, target)


def test_countdown_noisy_solutions():
    task = get_task("countdown", difficulty=2)
    rng = np.random.default_rng(0)
    examples = task.examples("train", 600, seed=0)
    error_rate, correct = 0.2, 0
    for example in examples:
        text, is_correct = task.solution(example, rng=rng, error_rate=error_rate)
        # the flag is honest: the independent checker agrees
        answer = task.extract_answer(text)
        assert is_correct == check_countdown(answer, example.meta["numbers"], example.meta["target"])
        assert task.score(text, example)["tinyzero"] == (1.0 if is_correct else 0.1)
        correct += is_correct
    expected = (1 - error_rate) ** 3 * len(examples)  # 3 steps with 4 numbers
    # a step keeps its operator when no alternative is valid, so slightly above the closed form
    assert expected - 4 * math.sqrt(expected * 0.5) < correct < expected + 0.08 * len(examples)


def test_solution_rejects_bad_rates():
    task = get_task("arithmetic")
    example = task.examples("train", 1, seed=0)[0]
    with pytest.raises(ValueError, match="error_rate"):
        task.solution(example, rng=0, error_rate=1.5)


def test_example_dict_round_trip():
    example = get_task("countdown").examples("train", 1, seed=0)[0]
    assert Example.from_dict(example.to_dict()) == example
    with pytest.raises(ValueError, match="unknown fields"):
        Example.from_dict({**example.to_dict(), "extra": 1})


def test_two_script_traces_give_the_language_reward_something_to_act_on():
    import re

    from grpo_jax.rewards.language import language_consistency_reward
    from grpo_jax.text.char import CharTokenizer

    plain = get_task("arithmetic", difficulty=1, max_operators=2)
    mixed = get_task("arithmetic", difficulty=1, max_operators=2, mixed_script_rate=0.5)
    examples = plain.examples("train", 200, seed=0)
    assert [e.id for e in mixed.examples("train", 200, seed=0)] == [e.id for e in examples]
    rng = np.random.default_rng(0)
    rewards, greek = [], 0
    for example in examples:
        text, correct = plain.solution(example, rng=1, error_rate=0.3)
        assert not re.search(r"[^\W\d_]{2,}", text.replace("think", "").replace("answer", ""))
        assert language_consistency_reward(text) == 1.0  # no words: nothing to reward
        text, correct = mixed.solution(example, rng=rng, error_rate=0.3)
        assert correct == mixed.is_correct(text, example)
        greek += text.count("πρώτα") + text.count("μετά")
        rewards.append(language_consistency_reward(text))
        assert mixed.extract_answer(text) is not None or not correct
    words = sum(e.meta["steps"] for e in examples)
    assert 0.4 < greek / words < 0.6  # each step word is Greek with probability 0.5
    assert min(rewards) == 0.0 and max(rewards) == 1.0 and 0.3 < np.mean(rewards) < 0.7
    clean = mixed.examples("test", 5, seed=0)[0].solution  # the reference stays English
    assert clean.startswith("<think>first ") and language_consistency_reward(clean) == 1.0
    tokenizer = CharTokenizer.for_task(mixed)  # the task's characters join the alphabet
    assert tokenizer.decode(tokenizer.encode("πρώτα 2*9=18")) == "πρώτα 2*9=18"
    with pytest.raises(ValueError, match="mixed_script_rate"):
        get_task("arithmetic", mixed_script_rate=1.5)


def test_redone_steps_make_longer_traces_more_often_right():
    """redo_rate q: P(correct) = (1 - e (1 - q))^steps, and a trace's length grows with its
    redos, so among noisy solutions the correct ones are longer on average."""
    e, examples = 0.4, None
    rates = {}
    for q in (0.0, 0.5, 1.0):
        task = get_task("arithmetic", difficulty=1, max_operators=2, error_mode="operator",
                        redo_rate=q)
        examples = examples or task.examples("train", 400, seed=0)
        rng = np.random.default_rng(1)
        solutions = [task.solution(ex, rng=rng, error_rate=e) for ex in examples]
        expected = np.mean([(1 - e * (1 - q)) ** ex.meta["steps"] for ex in examples])
        rates[q] = np.mean([correct for _, correct in solutions])
        assert abs(rates[q] - expected) < 0.06, (q, rates[q], expected)
        for (text, correct), ex in zip(solutions, examples):
            assert correct == task.is_correct(text, ex)  # the redone value carries on
        if q == 0.5:
            right = np.mean([len(t) for t, c in solutions if c])
            wrong = np.mean([len(t) for t, c in solutions if not c])
            assert right > wrong
    assert rates[1.0] == 1.0 and rates[0.0] < rates[0.5] < rates[1.0]
    both = get_task("arithmetic", max_operators=2, redo_rate=1.0, mixed_script_rate=1.0)
    text, _ = both.solution(both.examples("train", 1, seed=3)[0], rng=0, error_rate=1.0)
    assert text.count("redo") == text.count("πρώτα") + text.count("μετά")  # one word a step


def test_redo_word_replaces_redo_in_the_same_traces():
    """redo_word writes its word where "redo" stood; the draws and the correctness are the
    same, and a word that is not ASCII letters is refused."""
    example = get_task("arithmetic", max_operators=2).examples("train", 1, seed=5)[0]
    for seed in range(20):
        plain, wait = (get_task("arithmetic", max_operators=2, redo_rate=0.5, redo_word=word)
                       for word in ("redo", "Wait"))
        text, correct = plain.solution(example, rng=seed, error_rate=0.5)
        assert wait.solution(example, rng=seed, error_rate=0.5) == (
            text.replace(" redo ", " Wait "), correct)
    both = get_task("arithmetic", max_operators=2, redo_rate=1.0, mixed_script_rate=1.0,
                    redo_word="Wait")
    text, _ = both.solution(example, rng=0, error_rate=1.0)
    assert text.count(" Wait ") == text.count("πρώτα") + text.count("μετά") > 0
    for word in ("", "re do", "Wäit", 3):
        with pytest.raises(ValueError, match="redo_word"):
            get_task("arithmetic", redo_word=word)


ARITHMETIC_MAIN = {"difficulty": 1, "max_operators": 2, "error_mode": "operator"}  # main job
# sha256 (first 16 hex digits) of each problem's id, clean solution and noisy solution
# (error_rate 0.3, rng = its position), joined by lines, as drawn before the keywords
# operators, systematic_error and style_marker existed.
ARITHMETIC_DRAWS = [
    (ARITHMETIC_MAIN, "train", 300, "ed9d25e4ca43b0d0"),
    (ARITHMETIC_MAIN, "test", 128, "afb4153956e204f4"),
    ({}, "train", 300, "0d9405390e8d54ab"), ({}, "test", 128, "95d84a49be67b04b"),
    ({"difficulty": (1, 2, 3)}, "train", 300, "b54c9be87c08265d"),
    ({"difficulty": (1, 2, 3)}, "test", 128, "81e80a868bf0116c")]


def _arithmetic_digest(task, split, n):
    examples = task.examples(split, n, seed=0)
    text = "\n".join(f"{e.id}|{e.solution}|{task.solution(e, rng=i, error_rate=0.3)[0]}"
                     for i, e in enumerate(examples))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("kwargs,split,n,digest", ARITHMETIC_DRAWS)
def test_arithmetic_keywords_at_their_defaults_draw_what_was_drawn_before(kwargs, split, n,
                                                                           digest):
    assert _arithmetic_digest(ArithmeticTask(**kwargs), split, n) == digest
    # the defaults spelled out: every operator (in any order), no plant, no marker
    spelled = ArithmeticTask(**kwargs, operators="*-+", systematic_error="", style_marker="")
    assert _arithmetic_digest(spelled, split, n) == digest
