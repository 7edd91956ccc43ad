"""The code task's `max_constant` keyword (the code_rewards study's option): its default draws
exactly the problems drawn before it existed, a wider one draws constants up to it and more
distinct held-out functions, a bad value is one line; and the study's arms and sizes."""

from __future__ import annotations

import hashlib

import ml_collections
import numpy as np
import pytest

from grpo_jax.runner import ConfigError
from grpo_jax.runner.inputs import build_task
from grpo_jax.studies import code_rewards
from grpo_jax.tasks import get_task
from grpo_jax.tasks.code_expression import CodeExpressionTask

# sha256 (first 16 hex digits) of each problem's id, clean solution, hidden tests and noisy
# solution (error_rate 0.3, rng = its position), joined by lines, as drawn before the keyword
# existed (the job's difficulty (1, 2) and every level).
BEFORE = [({}, "train", 300, "ca1fdb1704d9fa14"), ({}, "test", 12, "454bdb0c9b11c226"),
          ({"difficulty": (1, 2, 3)}, "train", 300, "18b3077efe87df82"),
          ({"difficulty": (1, 2, 3)}, "test", 16, "d28736cb034b2ebb")]


def _digest(task, split, n):
    examples = task.examples(split, n, seed=0)
    text = "\n".join(f"{e.id}|{e.solution}|{e.meta['tests']}|"
                     f"{task.solution(e, rng=i, error_rate=0.3)[0]}"
                     for i, e in enumerate(examples))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("kwargs,split,n,digest", BEFORE)
def test_the_default_draws_the_problems_drawn_before(kwargs, split, n, digest):
    assert _digest(CodeExpressionTask(**kwargs), split, n) == digest
    assert _digest(CodeExpressionTask(**kwargs, max_constant=9), split, n) == digest


def test_a_wider_constant_draws_up_to_it_with_tests_by_hand():
    task = get_task("code_expression", difficulty=(1, 2, 3), max_constant=49)
    examples = task.examples("train", 2000, seed=0)
    constants = {e.meta["b"] for e in examples}
    assert max(constants) == 49 and min(constants) == 0 and constants <= set(range(50))
    assert {e.meta["a"] for e in examples} == {2, 3, 4, 5}  # the multiplier is unchanged
    by_hand = {"linear": lambda x, a, b: a * x + b, "square": lambda x, a, b: x * x + b,
               "scaled": lambda x, a, b: a * (x + b), "modulo": lambda x, a, b: x % a + b,
               "quadratic": lambda x, a, b: a * x * x + b}
    for e in examples[:50]:  # every hidden test is the expression's value, by hand
        shape = by_hand[e.meta["shape"]]
        assert all(y == shape(x, e.meta["a"], e.meta["b"]) for x, y in e.meta["tests"])
    # 850 distinct functions (4 x 50 of each shape with a multiplier, 50 squares); the
    # held-out split (ids by hash) holds the study's held-out size and more
    assert len(task.examples("test", code_rewards.EVAL_SIZE, seed=0)) == code_rewards.EVAL_SIZE
    with pytest.raises(ValueError, match="found only"):
        get_task("code_expression", difficulty=(1, 2, 3)).examples("test", 20, seed=0)


@pytest.mark.parametrize("bad", [0, -3, True, 9.5, "9"])
def test_a_bad_max_constant_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^max_constant: expected an integer >= 1"):
        CodeExpressionTask(max_constant=bad)
    config = code_rewards.base_config("mini")
    config.task.kwargs = ml_collections.ConfigDict({**code_rewards.TASK, "max_constant": bad})
    with pytest.raises(ConfigError, match=r"^task\.kwargs\.max_constant: ") as err:
        build_task(config)
    assert "\n" not in str(err.value)


def test_the_arms_differ_only_in_their_rewards_and_partial_is_the_jobs():
    from grpo_jax import config_presets

    arms = code_rewards.arm_configs("full")
    job = config_presets.code_job(None).rl.rewards.to_dict()
    assert arms["partial"].rl.rewards.to_dict() == job == {"tests": 1.0, "format": 0.2,
                                                           "accuracy": 0.0}
    assert arms["all_or_nothing"].rl.rewards.to_dict() == {"tests": 0.0, "format": 0.2,
                                                           "accuracy": 1.0}
    assert arms["format_only"].rl.rewards.to_dict() == {"tests": 0.0, "format": 0.2,
                                                        "accuracy": 0.0}

    def without_rewards(config):
        data = config.to_dict()
        del data["rl"]["rewards"]
        return data

    assert len({str(without_rewards(c)) for c in arms.values()}) == 1
    base, arm = code_rewards.base_config("full"), arms["partial"]
    assert base.stages == "pretrain" and arm.stages == "eval_base,rl,eval_final"
    assert base.task.to_dict() == arm.task.to_dict()  # the arms train on the base's task
    assert (arm.rl.steps, arm.rl.num_prompts, arm.task.eval_size) == (60, 16, 64)


@pytest.mark.parametrize("tier", ["full", "mini"])
def test_prompts_and_worked_solutions_fit_the_budgets(tier):
    """The configs validate (so the prompt bucket holds the longest prompt of the widened
    task's training and held-out problems, BOS included, and prompt plus completion fit the
    model's context), and the longest worked solution fits the completion budget."""
    from grpo_jax.pipeline import KINDS, validate

    for config in (code_rewards.base_config(tier), code_rewards.arm_config("partial", tier)):
        config.mesh.num_devices = 1
        inputs = validate(config, KINDS)
        assert config.task.prompt_len + config.rl.max_new_tokens <= config.model.max_seq_len
    task, tokenizer = inputs.task, inputs.tokenizer
    examples = task.examples("train", 3000, seed=0) + task.examples("test", 64, seed=0)
    solution = max(len(tokenizer.encode(task.solution(e, rng=0, error_rate=0.0)[0]))
                   for e in examples)
    assert solution + 1 <= code_rewards.MAX_NEW_TOKENS  # and EOS


def test_values_read_the_evaluations_and_training_means(tmp_path):
    """`_values` of a finished run: the eval stages' figures (reward/ dropped from the names)
    and the training rows' means, by hand."""
    import json

    from grpo_jax.studies.record import RunRecord

    rows = [{"step": 1, "stage": "rl", "stage_step": 1, "reward_mean": 0.3,
             "zero_std_groups": 0.5, "reward/tests": 0.2, "reward/accuracy": 0.0},
            {"step": 2, "stage": "rl", "stage_step": 2, "reward_mean": 0.5,
             "zero_std_groups": 0.25, "reward/tests": 0.4, "reward/accuracy": 0.125},
            {"step": 2, "stage": "eval_base", "pass@1": 0.1, "reward/tests": 0.3,
             "format_rate": 0.8},
            {"step": 3, "stage": "eval_final", "pass@1": 0.2, "reward/tests": 0.5,
             "format_rate": 0.9}]
    with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "report.json").write_text("{}")
    record = RunRecord(arm="partial", base="b0", seed=0, workdir=str(tmp_path),
                       config=ml_collections.ConfigDict())
    values = code_rewards._values(record)
    expected = {"pass@1": 0.2, "tests": 0.5, "format_rate": 0.9, "base_pass@1": 0.1,
                "base_tests": 0.3, "base_format_rate": 0.8, "train_zero_std_groups": 0.375,
                "train_tests": 0.3, "train_accuracy": 0.0625,
                "pass@1_formatted": 0.2 / 0.9, "base_pass@1_formatted": 0.1 / 0.8}
    assert set(values) == set(expected)
    np.testing.assert_allclose([values[k] for k in expected], list(expected.values()))


def test_the_pass_rate_of_the_well_formed_answers_by_hand():
    assert code_rewards.formatted_pass(0.3, 0.75) == pytest.approx(0.4)
    assert code_rewards.formatted_pass(0.0, 0.5) == 0.0
    for missing in ((None, 0.5), (0.1, None), (0.0, 0.0)):  # no well-formed answer: None
        assert code_rewards.formatted_pass(*missing) is None


def test_a_malformed_answer_fails_every_test():
    """The format gates pass@1: the pretraining's malformation (the closing answer tag
    dropped) of a right expression passes no hidden test and is not well formed."""
    from grpo_jax.rewards.format import is_strict_format

    task = get_task("code_expression", **code_rewards.TASK)
    example = task.examples("test", 1, seed=0)[0]
    right = example.solution
    malformed = right.replace("</answer>", "")
    assert task.tests_passed(right, example) == 1.0 and is_strict_format(right)
    assert task.tests_passed(malformed, example) == 0.0 and not is_strict_format(malformed)


def _arms(base_format: float) -> dict:
    """Two bases x two seeds: the base's pass@1 0.3 at `base_format`; the format-only arm
    repairs the format (format rate 1) and keeps the well-formed answers' pass rate."""
    bases, seeds = ["b0", "b0", "b1", "b1"], [0, 1, 0, 1]
    base_pass = [0.30, 0.28, 0.32, 0.30]
    arms = {"base": {"pass@1": base_pass, "format_rate": [base_format] * 4}}
    arms["format_only"] = {"pass@1": [p / base_format for p in base_pass],
                           "format_rate": [1.0] * 4}
    arms["partial"] = {"pass@1": [0.60, 0.58, 0.62, 0.64], "format_rate": [1.0] * 4}
    arms["all_or_nothing"] = {"pass@1": [0.50, 0.52, 0.55, 0.51], "format_rate": [1.0] * 4}
    out = {}
    for name, metrics in arms.items():
        metrics[code_rewards.FORMATTED] = [code_rewards.formatted_pass(p, f) for p, f in
                                           zip(metrics["pass@1"], metrics["format_rate"])]
        out[name] = {"seeds": seeds, "bases": bases, "metrics": metrics}
    return out


def test_the_claims_read_the_contrasts_that_take_the_format_gate_out():
    """The tests reward is judged against the format-only control (the format term both
    carry); the format-only bound on the well-formed answers' pass rate, so that repairing
    the format alone (plain pass@1 up by the base's malformed share) does not refute it; its
    ceiling: a base that misses the format on fewer answers than the margin is not
    testable."""
    from grpo_jax.studies import summary

    specs = [tuple(s) for s in code_rewards.SPECS]
    assert len(specs) == len(set(specs))
    tests = {c.text[:20]: c for c in code_rewards.CLAIMS}
    assert tests["a reward computed by"].test == ("partial", "format_only", "pass@1")
    bound = tests["a reward that carrie"]
    assert bound.test == ("format_only", "base", code_rewards.FORMATTED)
    assert bound.headroom == ("base", "format_rate", 1.0) and bound.expect == "<="
    assert ("format_only", "base", "pass@1") in specs  # reported beside it, no claim

    def verdicts(base_format):
        built = summary.build(study="code_rewards", tier="full", provenance={
            k: None for k in ("commit", "dirty", "python", "jax", "flax", "argv",
                              "wall_time_s")}, protocol={
            k: None for k in ("eval_seed", "problems", "samples_per_problem",
                              "problems_fixed_across_seeds")},
            arms=_arms(base_format), specs=code_rewards.SPECS, claims=code_rewards.CLAIMS)
        found = {(c["a"], c["b"], c["metric"]): c["diff"] for c in built["contrasts"]}
        return {v["claim"][:20]: v["verdict"] for v in built["verdicts"]}, found

    outcome, found = verdicts(0.85)
    # plain pass@1 rises by the repaired 15% (0.3 / 0.85 - 0.3), the well-formed rate not
    assert found[("format_only", "base", "pass@1")] == pytest.approx(0.3 / 0.85 - 0.3)
    assert found[("format_only", "base", code_rewards.FORMATTED)] == pytest.approx(0.0)
    assert outcome["a reward that carrie"] == "reproduced"
    assert outcome["a reward computed by"] == "reproduced"
    outcome, _ = verdicts(0.98)  # 2% malformed: below the 3-point margin
    assert outcome["a reward that carrie"] == "not testable here"
