"""The spurious rewards (Shao et al. 2025): a coin flip that ignores correctness and a
reward for being wrong, by hand, and both resolved by name for a run."""

from __future__ import annotations

import types

import pytest

from grpo_jax.rewards.spurious import incorrect_reward, random_reward
from grpo_jax.runner.rewards import resolve_reward_fns
from grpo_jax.tasks import get_task
from grpo_jax.tasks.base import Example


def test_the_coin_ignores_correctness_and_is_reproducible():
    coin = random_reward(seed=0)
    examples = [Example(id=f"p{i}", prompt="", answer=str(i)) for i in range(400)]
    right = [coin(f"<answer>{ex.answer}</answer>", ex) for ex in examples]
    wrong = [coin(f"<answer>{ex.answer}x</answer>", ex) for ex in examples]
    assert set(right) == {0.0, 1.0}
    # Bernoulli(0.5) on 400 draws each: within 5 standard deviations (10) of 200
    assert abs(sum(right) - 200) < 50 and abs(sum(wrong) - 200) < 50
    # independent of the answer: right and wrong agree about half the time, not always
    agree = sum(a == b for a, b in zip(right, wrong))
    assert abs(agree - 200) < 50
    assert right == [random_reward(seed=0)(f"<answer>{ex.answer}</answer>", ex)
                     for ex in examples]  # the same on a resume
    assert right != [random_reward(seed=1)(f"<answer>{ex.answer}</answer>", ex)
                     for ex in examples]
    assert random_reward(probability=0.0)("x", examples[0]) == 0.0
    assert random_reward(probability=1.0)("x", examples[0]) == 1.0
    with pytest.raises(ValueError, match="probability"):
        random_reward(probability=1.5)


def test_incorrect_rewards_the_wrong_answers_of_the_tasks_accuracy():
    task = get_task("arithmetic")
    example = task.examples("train", 1, seed=0)[0]
    run = types.SimpleNamespace(task=task, config=types.SimpleNamespace(seed=3), kinds=None)
    fns = resolve_reward_fns(run, ["incorrect", "random", "accuracy"])
    solution, ok = task.solution(example, rng=0, error_rate=0.0)
    assert ok and fns["accuracy"](solution, example) == 1.0
    assert fns["incorrect"](solution, example) == 0.0
    wrong, ok = task.solution(example, rng=0, error_rate=1.0)
    assert not ok and fns["incorrect"](wrong, example) == 1.0
    assert fns["incorrect"]("no answer at all", example) == 1.0
    assert fns["random"]("x", example) == random_reward(seed=3)("x", example)
    assert incorrect_reward(lambda c, e: 0.4)("x", example) == pytest.approx(0.6)


def test_the_clipped_incorrect_arm_is_the_clipped_random_arm_on_the_incorrect_reward():
    """`incorrect, mu=4` takes the clipped random arm's passes, clip and learning rate and the
    one-pass incorrect arm's reward: its config differs from each in those fields only."""
    from grpo_jax.studies import spurious_rewards as study

    arms = study.arm_configs("full")
    clipped, one_pass = arms[study.INCORRECT_CLIPPED], arms[study.INCORRECT]
    # epsilon None: the algorithm's own clip (0.2), as the clipped random arm's
    assert (clipped.rl.num_iterations, clipped.rl.epsilon, clipped.rl.lr) == (4, None, 1e-3)
    assert dict(clipped.rl.rewards) == {"incorrect": 1.0}
    random_clipped = arms[study.CLIPPED].to_dict()
    random_clipped["rl"]["rewards"] = {"incorrect": 1.0}
    assert clipped.to_dict() == random_clipped
    one = one_pass.to_dict()
    one["rl"].update(num_iterations=4, epsilon=None, lr=1e-3)
    assert clipped.to_dict() == one
