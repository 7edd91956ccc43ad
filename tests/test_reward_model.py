"""Learned reward model: Bradley-Terry loss literals, pairs from the task, training, scoring."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import run_stage
from grpo_jax.rl import reward_model as rm
from grpo_jax.stages import default_section
from grpo_jax.stages import reward_model as reward_model_stage

from configs import default as default_config


def test_bradley_terry_literals_and_gradient():
    loss = np.asarray(rm.bradley_terry_loss(jnp.array([2.0, 0.0, -1.0]),
                                            jnp.array([0.0, 0.0, 1.0])))
    # -log sigmoid(d) = log(1 + exp(-d)) for d = 2, 0, -2.
    np.testing.assert_allclose(loss, [math.log1p(math.exp(-2)), math.log(2.0),
                                      math.log1p(math.exp(2))], rtol=1e-6)
    # d loss / d r_chosen = -(1 - sigmoid(d)) = -sigmoid(-d).
    grad = jax.grad(lambda c: rm.bradley_terry_loss(c, jnp.zeros(1)).sum())(jnp.array([1.0]))
    np.testing.assert_allclose(grad, [-1.0 / (1.0 + math.e)], rtol=1e-6)
    with pytest.raises(ValueError, match="bradley_terry_loss"):
        rm.bradley_terry_loss(jnp.zeros(2), jnp.zeros(3))


def test_preference_pairs_are_correct_versus_incorrect():
    from grpo_jax import tasks

    task = tasks.get_task("arithmetic", difficulty=1)
    pairs = rm.preference_pairs(task, task.examples("train", 20, seed=0), seed=0)
    assert len(pairs) >= 18
    for ex, chosen, rejected in pairs:
        assert task.is_correct(chosen, ex) and not task.is_correct(rejected, ex)


def test_reward_model_stage_learns_and_scores(tmp_path):
    config = default_config.get_config("smoke")
    config.model.num_layers = 1  # one block (on all 8 devices): a fraction of the compile
    config.rm = default_section("reward_model")
    config.rm.update(dict(num_pairs=64, eval_pairs=32, steps=30, batch_size=16, lr=5e-3,
                          init="scratch"))
    config.stages = "rm"
    run = run_stage(config, "rm", tmp_path)
    lines = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rm"]
    losses = [r["loss"] for r in lines if "loss" in r]
    assert len(losses) == 30 and losses[0] == pytest.approx(math.log(2.0), abs=1e-5)
    # Training lowers the Bradley-Terry loss below its chance level log 2 (30 steps on a
    # one-block smoke model: held-out accuracy is still near chance, so it is only
    # range-checked).
    assert np.mean(losses[-5:]) < math.log(2.0) - 0.04
    final = lines[-1]
    assert 0.0 <= final["eval_pair_accuracy"] <= 1.0 and final["eval_pairs"] >= 28
    # The saved model reloads into a scorer and a per-completion reward function.
    scorer = reward_model_stage.load(run, "rm")
    pairs = rm.preference_pairs(run.task, run.task.examples("test", 8, seed=5), seed=5)
    chosen = scorer.score([c for _, c, _ in pairs], [e for e, _, _ in pairs])
    from grpo_jax.runner.rewards import resolve_reward_fns

    section = ml_collections.ConfigDict({"kind": "rl", "reward_model": "rm"})
    fn = resolve_reward_fns(run, ["reward_model"], section=section)["reward_model"]
    assert fn(pairs[0][1], pairs[0][0]) == pytest.approx(float(chosen[0]), rel=1e-5, abs=1e-6)
    # Batched scoring (one call per rollout) gives the per-row values.
    np.testing.assert_allclose(fn.batched([c for _, c, _ in pairs], [e for e, _, _ in pairs]),
                               chosen, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="reward_model"):
        reward_model_stage.load(run, "missing_stage")
