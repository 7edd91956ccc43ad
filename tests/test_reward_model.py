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


def test_reward_model_stage_stopped_and_resumed_ends_with_the_same_model(tmp_path, monkeypatch):
    """4 steps straight vs SIGTERM after step 2 (a checkpoint of the run's parameters, the
    reward model's and its optimizer state, then a stop) and the same command again: the
    same saved reward model, bit for bit, and the same logged steps once each."""
    import os
    import signal

    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.metrics import MetricWriter
    from grpo_jax.pipeline import train_and_evaluate
    from grpo_jax.runner.guards import Preempted

    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.rm = default_section("reward_model")
    config.rm.update(dict(num_pairs=32, eval_pairs=8, steps=4, batch_size=8, lr=5e-3))
    config.stages = "rm"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_and_evaluate(config, str(straight))
    original = MetricWriter.write

    def stop(self, at, metrics, *, stage=None):
        if stage == "rm" and metrics.get("stage_step") == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, at, metrics, stage=stage)

    monkeypatch.setattr(MetricWriter, "write", stop)
    with pytest.raises(Preempted):
        train_and_evaluate(config, str(resumed))
    monkeypatch.setattr(MetricWriter, "write", original)
    with Checkpointer(resumed / "checkpoints") as ckpt:
        meta = ckpt.restore_meta(ckpt.latest_step())
    assert (meta["stage"], meta["stage_step"], meta["stage_done"]) == ("rm", 2, False)
    train_and_evaluate(config, str(resumed))

    def saved(workdir):
        with Checkpointer(workdir / "rm") as ckpt:
            state, meta = ckpt.restore()
        return state["params"], meta

    (a, meta_a), (b, meta_b) = saved(straight), saved(resumed)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert meta_a == meta_b
    rows = lambda workdir: [r for r in read_metrics(workdir / "metrics.jsonl")
                            if r["stage"] == "rm" and "loss" in r]
    assert [r["stage_step"] for r in rows(resumed)] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows(resumed)] == [r["loss"] for r in rows(straight)]
