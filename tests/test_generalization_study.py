"""The arithmetic task's `operators` keyword (the generalization study's option): its default
draws exactly the problems drawn before it existed, a restricted draw respects it, a bad value
is one line; and the study's arms and its arithmetic, by hand."""

from __future__ import annotations

import ml_collections
import pytest

from grpo_jax.runner import ConfigError
from grpo_jax.runner.inputs import build_task
from grpo_jax.studies import generalization, update_sparsity
from grpo_jax.tasks.arithmetic import ArithmeticTask
from grpo_jax.tasks.base import split_of

MAIN = {"difficulty": 1, "max_operators": 2, "error_mode": "operator"}  # the main job's draw

@pytest.mark.parametrize("operators", ["+-", "*", "-"])
def test_a_restricted_draw_uses_only_its_operators(operators):
    task = ArithmeticTask(**MAIN, operators=operators)
    for split, n in (("train", 400), ("test", 40)):
        examples = task.examples(split, n, seed=3)
        used = {op for e in examples for op in e.meta["operators"]}
        assert used == set(operators)  # only these, and each of them
        for e in examples:
            assert e.prompt == "".join(
                f"{op}{v}" for op, v in zip(["", *e.meta["operators"]], e.meta["operands"]))
            # the full task's split of the same problem: a restricted held-out problem is
            # one of the full task's held-out problems, never a training one
            assert split_of(e.id, task.test_fraction) == split


@pytest.mark.parametrize("bad", ["", "/", "++", "+x", 3, None])
def test_a_bad_operator_set_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^operators: expected distinct operators from "):
        ArithmeticTask(operators=bad)


def test_a_bad_operator_set_in_a_config_names_the_field():
    config = ml_collections.ConfigDict({"task": {"name": "arithmetic",
                                                 "kwargs": {"operators": "+/"}}})
    with pytest.raises(ConfigError, match=r"^task\.kwargs\.operators: "):
        build_task(config)


def test_the_arms_post_train_on_the_slice_at_update_sparsity_budget():
    configs = generalization.arm_configs("full")
    assert set(configs) == {"grpo", "sft"}
    for arm, config in configs.items():
        assert config.task.kwargs.operators == "+-"
        reference = update_sparsity.arm_config("rl" if arm == "grpo" else "sft", "full")
        reference.task.kwargs.operators = "+-"
        assert config.to_dict() == reference.to_dict()  # update_sparsity's run but the slice
    grpo, sft = configs["grpo"], configs["sft"]
    sequences = grpo.rl.num_prompts * grpo.rl.group_size
    assert (sft.sft.steps, sft.sft.batch_size, sft.sft.lr) == (grpo.rl.steps, sequences,
                                                               grpo.rl.lr)
    assert grpo.stages == "eval_base,rl,eval_final" and sft.stages == "eval_base,sft,eval_final"


def test_the_out_of_distribution_set_is_held_out_products_only():
    config = generalization.arm_config("grpo", "full")
    examples = generalization.ood_examples(config, generalization.OOD_PROBLEMS["full"])
    assert len({e.id for e in examples}) == len(examples) == 64
    assert all(set(e.meta["operators"]) == {"*"} for e in examples)
    assert all(split_of(e.id, 0.1) == "test" for e in examples)
    # the same problems for every seed (task.eval_seed), whatever the run's seed
    config.seed = 7
    assert [e.id for e in generalization.ood_examples(config, 64)] == [e.id for e in examples]


def test_ood_figures_by_hand():
    problems = [{"samples": 4, "correct": 1, "formatted": 4},
                {"samples": 4, "correct": 3, "formatted": 2}]
    # pass@1 = (1 + 3) / 8; format rate = (4 + 2) / 8
    assert generalization.ood_figures(problems) == {"pass@1_ood": 0.5, "ood_format_rate": 0.75}
    assert generalization.ood_figures(None) == {"pass@1_ood": None, "ood_format_rate": None}


def test_gain_gap_by_hand():
    # gain on the slice 0.50 - 0.30 = 0.20, change out of it 0.25 - 0.20 = 0.05: gap 0.15
    assert generalization.gain_gap(0.5, 0.3, 0.25, 0.2) == pytest.approx(0.15)
    # a drop out of the slice widens the gap: 0.20 - (0.10 - 0.20) = 0.30
    assert generalization.gain_gap(0.5, 0.3, 0.1, 0.2) == pytest.approx(0.30)
    assert generalization.gain_gap(0.5, None, 0.1, 0.2) is None


def test_every_testable_claim_says_how_its_test_could_fail_here():
    for claim in generalization.CLAIMS:
        assert claim.can_fail or claim.untestable, claim.test
