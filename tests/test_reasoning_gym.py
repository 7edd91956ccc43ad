"""The reasoning_gym task: splits, the dataset's scorer as the guarded accuracy reward, the
weighted mix, worked solutions, one-line errors, and a GRPO smoke run on it."""

import re
import sys

import numpy as np
import pytest

pytest.importorskip("reasoning_gym")

from grpo_jax import losses  # noqa: E402
from grpo_jax.rewards import python as python_rewards  # noqa: E402
from grpo_jax.rl.rollout import score_completions  # noqa: E402
from grpo_jax.tasks import get_task  # noqa: E402
from grpo_jax.tasks.reasoning_gym import ReasoningGymTask, parse_datasets  # noqa: E402

SMALL = {"chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
         "spell_backward": {"min_word_len": 3, "max_word_len": 5},
         "letter_counting": {"min_words": 2, "max_words": 3}}


@pytest.fixture(scope="module")
def task():
    return get_task("reasoning_gym", datasets="chain_sum:2,spell_backward:1",
                    dataset_kwargs=SMALL)


def _chain_value(question: str) -> int:
    """The value of "... problem: 3 + 4 - 2 =" computed from the question text."""
    expression = question.rsplit(":", 1)[1].rstrip("= ")
    terms = re.findall(r"([+-]?)\s*(\d+)", expression)
    return sum(-int(n) if sign == "-" else int(n) for sign, n in terms)


def test_splits_are_disjoint_deterministic_and_from_separate_seeds(task):
    train = task.examples("train", 600, seed=0)
    test = task.examples("test", 60, seed=0)
    assert [e.id for e in train] == [e.id for e in task.examples("train", 600, seed=0)]
    assert [e.id for e in test] == [e.id for e in task.examples("test", 60, seed=0)]
    assert not {e.id for e in train} & {e.id for e in test}
    assert len({e.id for e in test}) == 60  # held-out problems are distinct
    for name in ("chain_sum", "spell_backward"):
        seeds = {split: {e.meta["seed"] for e in examples if e.meta["dataset"] == name}
                 for split, examples in (("train", train), ("test", test))}
        assert len(seeds["train"]) == len(seeds["test"]) == 1
        assert seeds["train"] != seeds["test"]
    other = task.examples("train", 50, seed=1)
    assert [e.id for e in other] != [e.id for e in train[:50]]


def test_weights_are_respected_in_every_prefix(task):
    names = [e.meta["dataset"] for e in task.examples("train", 30, seed=3)]
    assert names.count("chain_sum") == 20 and names.count("spell_backward") == 10
    for n in range(1, 31):
        assert abs(names[:n].count("chain_sum") - 2 * n / 3) <= 1


def test_the_datasets_scorer_is_the_accuracy_reward(task):
    examples = task.examples("test", 12, seed=0)
    chain = next(e for e in examples if e.meta["dataset"] == "chain_sum")
    value = _chain_value(chain.prompt)  # computed here, not by the generator
    assert chain.answer == str(value)
    right = f"<think>steps</think><answer>{value}</answer>"
    wrong = f"<think>steps</think><answer>{value + 1}</answer>"
    assert task.accuracy_reward(right, chain) == 1.0 and task.is_correct(right, chain)
    assert task.accuracy_reward(wrong, chain) == 0.0 and not task.is_correct(wrong, chain)
    assert task.accuracy_reward(f"{value}", chain) == 0.0  # no answer tags

    spell = next(e for e in examples if e.meta["dataset"] == "spell_backward")
    word = spell.prompt.rsplit(": ", 1)[1]
    assert spell.answer == word[::-1]
    assert task.accuracy_reward(f"<answer>{word[::-1].upper()}</answer>", spell) == 1.0
    # The generator's partial credit, as its scorer gives it: letters in place / length.
    garbled = word[::-1][:-1] + ("z" if word[0].lower() != "z" else "y")
    expected = (len(word) - 1) / len(word)
    assert task.accuracy_reward(f"<answer>{garbled}</answer>", spell) == pytest.approx(expected)
    scores = task.score(f"<think>x</think><answer>{garbled}</answer>", spell)
    assert scores["correct"] == 0.0 and scores["format"] == 1.0


@pytest.mark.parametrize("scorer, reason", [
    (lambda answer, entry: 1 / 0, "exception"),
    (lambda answer, entry: float("nan"), "non_finite"),
    (lambda answer, entry: "1.0", "non_number"),
])
def test_a_failing_scorer_is_a_counted_error_not_a_stop(task, monkeypatch, scorer, reason):
    example = task.examples("test", 1, seed=0)[0]
    dataset = task._dataset(example.meta["dataset"], example.meta["seed"])
    monkeypatch.setattr(dataset, "score_answer", scorer)
    before = python_rewards.reward_error_counts()
    completion = f"<think></think><answer>{example.answer}</answer>"
    assert task.accuracy_reward(completion, example) == 0.0
    record = python_rewards.reward_error_record(before)
    assert record[f"reward_errors/{reason}"] == 1.0 and record["reward_errors"] == 1.0


def test_an_out_of_range_score_is_clipped(task, monkeypatch):
    example = task.examples("test", 1, seed=0)[0]
    dataset = task._dataset(example.meta["dataset"], example.meta["seed"])
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: 7)
    assert task.accuracy_reward("<answer>x</answer>", example) == 1.0
    monkeypatch.setattr(dataset, "score_answer", lambda answer, entry: -2.0)
    assert task.accuracy_reward("<answer>x</answer>", example) == 0.0


def test_worked_solutions_follow_the_metadata_and_score_honestly():
    task = get_task("reasoning_gym", datasets="chain_sum,letter_counting,spell_backward",
                    dataset_kwargs=SMALL)
    examples = task.examples("train", 90, seed=0)
    by_name = {}
    for ex in examples:
        by_name.setdefault(ex.meta["dataset"], ex)
    chain = by_name["chain_sum"]
    tokens = chain.prompt.rsplit(":", 1)[1].rstrip("= ").split()
    first = int(tokens[0]) + (int(tokens[2]) if tokens[1] == "+" else -int(tokens[2]))
    clean, ok = task.solution(chain, rng=0, error_rate=0.0)
    assert ok and clean.startswith(f"<think>{tokens[0]}{tokens[1]}{tokens[2]}={first}")
    letters = by_name["letter_counting"]
    letter = letters.prompt.split('"')[1]
    words = letters.prompt.split('"')[3].split()
    expected = " ".join(f"{w}:{w.lower().count(letter)}" for w in words)
    assert task.solution(letters, rng=0, error_rate=0.0)[0].startswith(f"<think>{expected}<")
    spell = by_name["spell_backward"]
    assert task.solution(spell, rng=0, error_rate=0.0)[0] == (
        f"<think>{' '.join(spell.answer)}</think><answer>{spell.answer}</answer>")
    # noisy solutions: the flag is the scorer's verdict, and errors lower the rate
    rates = []
    for error_rate in (0.0, 0.4):
        flags = []
        for i, ex in enumerate(examples):
            text, ok = task.solution(ex, rng=i, error_rate=error_rate)
            assert ok == task.is_correct(text, ex)
            flags.append(ok)
        rates.append(np.mean(flags))
    assert rates[0] == 1.0 and 0.2 < rates[1] < 0.9


def test_datasets_without_steps_get_a_near_miss_answer():
    task = get_task("reasoning_gym", datasets="gcd")
    ex = task.examples("train", 1, seed=0)[0]
    assert task.solution(ex, rng=0, error_rate=0.0) == (
        f"<think></think><answer>{ex.answer}</answer>", True)
    text, ok = task.solution(ex, rng=0, error_rate=1.0)
    assert not ok and abs(int(task.extract_answer(text)) - int(ex.answer)) in (1, 2, 3)


def test_the_vocabulary_is_learned_from_generated_text():
    from grpo_jax.text import CharTokenizer

    task = get_task("reasoning_gym", datasets="prime_factorization")  # "2 × 3"
    assert "×" in task.characters
    tokenizer = CharTokenizer.for_task(task)
    for ex in task.examples("test", 20, seed=0):
        assert tokenizer.decode(tokenizer.encode(ex.prompt + ex.solution)) == \
            ex.prompt + ex.solution


def test_problems_outside_the_vocabulary_are_skipped():
    task = get_task("reasoning_gym", datasets="chain_sum", dataset_kwargs=SMALL)
    assert any("7" in e.prompt for e in task.examples("train", 50, seed=0))
    task._alphabet.discard("7")  # as if no sampled problem had used it
    examples = task.examples("train", 50, seed=0)
    assert len(examples) == 50
    assert not any("7" in e.prompt + e.solution for e in examples)


@pytest.mark.parametrize("kwargs, line", [
    ({"datasets": "chain_sum,no_such_gen"},
     "datasets: unknown reasoning-gym dataset 'no_such_gen'; available: "),
    ({"datasets": "chain_sum:0"}, "datasets: the weight of 'chain_sum' must be a number > 0"),
    ({"datasets": "chain_sum:x"}, "datasets: the weight of 'chain_sum' must be a number > 0"),
    ({"datasets": "chain_sum,chain_sum"}, "datasets: 'chain_sum' is named twice"),
    ({"datasets": ""}, "datasets: expected 'name[:weight],...'"),
    ({"dataset_kwargs": {"chian_sum": {}}},
     "dataset_kwargs: unknown reasoning-gym dataset 'chian_sum'"),
    ({"dataset_kwargs": {"chain_sum": {"min_terms": 0}}},
     "dataset_kwargs: chain_sum: min_terms must be positive"),
    ({"dataset_kwargs": {"chain_sum": {"max_term": 3}}}, "dataset_kwargs: chain_sum: "),
    ({"test_fraction": 1.0}, "test_fraction: expected a number in (0, 1)"),
    ({"test_fraction": "0.1"}, "test_fraction: expected a number in (0, 1)"),
    ({"score_budget_seconds": 0}, "score_budget_seconds: expected a number > 0"),
])
def test_bad_arguments_are_one_line(kwargs, line):
    with pytest.raises(ValueError) as err:
        ReasoningGymTask(**kwargs)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_a_missing_package_names_the_install_command(monkeypatch):
    from configs import reasoning_gym_tasks
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.inputs import build_task

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(ValueError, match=r'^the reasoning-gym package is not installed; '
                                         r'pip install -e "\.\[reasoning_gym\]"$'):
        ReasoningGymTask(datasets="chain_sum")
    with pytest.raises(ConfigError, match=r'^task\.kwargs: the reasoning-gym package is not '
                                          r'installed; pip install -e "\.\[reasoning_gym\]"$'):
        build_task(reasoning_gym_tasks.get_config("smoke"))


def test_config_errors_name_the_field():
    from configs import reasoning_gym_tasks
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.inputs import build_task

    config = reasoning_gym_tasks.get_config("smoke")
    config.task.kwargs.datasets = "chain_sum,nope"
    with pytest.raises(ConfigError, match=r"^task\.kwargs\.datasets: unknown reasoning-gym "
                                          r"dataset 'nope'"):
        build_task(config)
    with pytest.raises(ValueError, match="unknown preset 'countdwn'"):
        reasoning_gym_tasks.get_config("countdwn")


def test_too_few_distinct_held_out_problems_is_an_error():
    task = get_task("reasoning_gym", datasets="chain_sum", dataset_kwargs={
        "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}})
    with pytest.raises(ValueError, match=r"^chain_sum: found only \d+ of 200 distinct test "
                                         r"problems"):
        task.examples("test", 200, seed=0)


def test_parse_datasets_forms():
    assert parse_datasets("countdown:2, chain_sum") == {"countdown": 2.0, "chain_sum": 1.0}
    assert parse_datasets(["a", "b:3"]) == {"a": 1.0, "b": 3.0}
    assert parse_datasets({"a": 0.5}) == {"a": 0.5}


def test_rewards_differ_within_a_group_of_the_tasks_solutions(task):
    """A group of noisy worked solutions scored by the task's rewards: GRPO's group
    advantages are not all zero."""
    example = next(e for e in task.examples("train", 10, seed=0)
                   if e.meta["dataset"] == "spell_backward")
    texts = [task.solution(example, rng=i, error_rate=0.3)[0] for i in range(8)]
    total, components = score_completions(texts, [example] * 8, task.reward_fns(),
                                          {"accuracy": 1.0, "format": 0.2})
    assert components["accuracy"].std() > 0
    advantages = np.asarray(losses.group_advantages(total, group_size=8, scale="group"))
    assert np.abs(advantages).max() > 0.5


def test_a_grpo_smoke_run_on_the_task_has_real_gradients(tmp_path):
    from configs import reasoning_gym_tasks
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    config = reasoning_gym_tasks.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1  # a shorter compile
    config.stages = "rl"  # from a random initialisation: the smoke preset's overlong
    train_and_evaluate(config, str(tmp_path))  # ramp makes the rewards differ in groups
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert len(rows) == 2 and all("reward/accuracy" in r for r in rows)
    assert any(r["reward_std"] > 0 for r in rows) and any(r["grad_norm"] > 0 for r in rows)
    assert all(r["reward_errors"] == 0 for r in rows)  # the scorer's guard counts, logged
    # The preset leaves the prompt bucket to the start-up (task.prompt_len 0) and the run's
    # config.json keeps the 0; the finished run's policy carries the bucket the run measured,
    # so a study can sample it after the fact.
    from grpo_jax.results import FinishedRun
    from grpo_jax.runner.inputs import prompt_bucket

    run = FinishedRun(str(tmp_path))
    assert run.config.task.prompt_len == 0
    policy = run.policy
    assert policy.config.task.prompt_len == prompt_bucket(
        run.config, policy.task, policy.tokenizer) > 0
