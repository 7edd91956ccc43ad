"""The code task (`tasks.code_expression`): hidden functions by hand, answers run on hidden
tests in the sandbox (never in the trainer), hostile answers scoring 0, and the code job's
smoke run with real gradients."""

from __future__ import annotations

import numpy as np

from grpo_jax.tasks import Example, get_task
from grpo_jax.tasks import code_expression
from grpo_jax.tasks.code_expression import evaluate_expression


def _problem(expression="2*x+3"):
    values = {x: eval(expression, {"x": x}) for x in (0, 1, 2, 3, 4, 5, 6, 7, 9)}
    return Example(id=f"code_expression:{expression}", prompt="", answer=expression,
                   meta={"tests": [[x, values[x]] for x in code_expression.HIDDEN]})


def test_problems_and_worked_solutions():
    task = get_task("code_expression", difficulty=(1, 2, 3))
    for example in task.examples("train", 30, seed=0):
        shown = dict(part[2:].split(")=") for part in example.prompt.split())
        assert [int(k) for k in shown] == list(code_expression.SHOWN)
        assert all(eval(example.answer, {"x": int(k)}) == int(v) for k, v in shown.items())
        text, correct = task.solution(example, rng=0, error_rate=0.0)
        assert correct and text.endswith(f"<answer>{example.answer}</answer>")
        wrong, correct = task.solution(example, rng=0, error_rate=1.0)
        assert not correct and wrong != text


def test_answers_run_on_hidden_tests_in_the_sandbox():
    assert evaluate_expression("x*x-1", [0, 3]) == [-1, 8]
    assert evaluate_expression("1/x", [0, 2]) == [None, None]  # an error, then a float
    assert evaluate_expression("__import__('os').system('true')", [1]) == [None]
    assert evaluate_expression("x" * 65, [1]) == [None]  # too long: never run
    assert evaluate_expression("9**9**9", [1]) == [None]  # stopped at the deadline
    task = get_task("code_expression")
    example = _problem("2*x+3")
    rewards = task.reward_fns()
    answers = ["<think>linear</think><answer>2*x+3</answer>",
               "<answer>2*x+3 if x < 5 else 0</answer>",  # passes 0 and 3 of the six
               "<answer>open('/etc/passwd').read()</answer>", "no answer"]
    np.testing.assert_allclose(rewards["tests"].batched(answers, [example] * 4),
                               [1.0, 2 / 6, 0.0, 0.0])
    assert rewards["accuracy"](answers[0], example) == 1.0
    assert rewards["accuracy"](answers[1], example) == 0.0


def test_tests_and_accuracy_share_one_sandbox_run(monkeypatch):
    task = get_task("code_expression")
    calls = []
    original = code_expression.run_python
    monkeypatch.setattr(code_expression, "run_python",
                        lambda *a, **k: calls.append(a) or original(*a, **k))
    example, answer = _problem("x*x+1"), "<answer>x*x+1</answer>"
    rewards = task.reward_fns()
    assert rewards["tests"](answer, example) == 1.0
    assert rewards["accuracy"](answer, example) == 1.0
    assert len(calls) == 1


def test_the_code_smoke_job_runs_the_tests_with_real_gradients(tmp_path):
    """configs/code.py:smoke's pretraining and GRPO with a one-layer model: the answers
    come in the format, so the sandbox runs their tests, and the rewards differ."""
    from configs import code
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    config = code.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1  # the format after 150 steps as with four, in half the time
    config.stages = "pretrain,rl"
    train_and_evaluate(config, str(tmp_path))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert all("reward/tests" in r and "reward/accuracy" in r for r in rows)
    assert any(r["reward_std"] > 0 for r in rows) and any(r["grad_norm"] > 0 for r in rows)
    assert any(r["reward/format"] > 0 for r in rows)  # answers in the format: tests ran
