"""Stale rollouts (rl.max_staleness): the importance-weight corrections against hand
counts, the version bookkeeping, and a pipelined run that resumes bit-exactly with its
pending rollouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rl.update import off_policy_weights
from grpo_jax.runner.rl_loop import StalenessError, check_versions

from tests.test_guards import (assert_same_params, final_params, killed_and_resumed,
                               rl_config)

PROX = np.log(np.array([[0.5, 0.2, 0.9], [0.3, 0.3, 0.1]], np.float32))
BEHAVIOUR = np.log(np.array([[0.25, 0.4, 0.3], [0.3, 0.05, 0.1]], np.float32))
MASK = np.array([[True, True, True], [True, True, False]])
# w = prox / behaviour: [[2, 0.5, 3], [1, 6, (masked)]]


@pytest.mark.parametrize("correction,weights,kept,extra", [
    ("none", [[1, 1, 1], [1, 1, 0]], MASK, {}),
    ("tis", [[2, 0.5, 2.5], [1, 2.5, 0]], MASK, {"is_truncated_frac": 2 / 5}),
    ("mis", [[2, 0.5, 0], [1, 0, 0]], [[True, True, False], [True, False, False]],
     {"is_masked_frac": 2 / 5}),
    ("decoupled", [[2, 0.5, 3], [1, 6, 0]], MASK, {}),
])
def test_importance_weights_against_hand_counts(correction, weights, kept, extra):
    w, k, metrics = off_policy_weights(PROX, BEHAVIOUR, MASK, correction=correction, cap=2.5,
                                       low=0.4, high=2.5)
    np.testing.assert_allclose(np.asarray(w), weights, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(k), kept)
    raw = [2, 0.5, 3, 1, 6]
    assert float(metrics["is_weight_mean"]) == pytest.approx(np.mean(raw), rel=1e-6)
    assert float(metrics["is_weight_max"]) == pytest.approx(6.0, rel=1e-6)
    # k3 of KL(mu || pi_prox) on tokens drawn from mu: mean of w - 1 - log w.
    assert float(metrics["kl_behaviour"]) == pytest.approx(
        np.mean([x - 1 - math.log(x) for x in raw]), rel=1e-5)
    for key, value in extra.items():
        assert float(metrics[key]) == pytest.approx(value)
    with pytest.raises(ValueError, match="correction: expected one of"):
        off_policy_weights(PROX, BEHAVIOUR, MASK, correction="vtrace")


def test_version_bookkeeping():
    np.testing.assert_array_equal(check_versions([3, 3, 5], 5, 2), [2, 2, 0])
    for version, message in ((2, "allows versions 3..5"), (6, "version 6"), (-1, "-1")):
        with pytest.raises(StalenessError, match=message):
            check_versions([5, version], 5, 2)
    with pytest.raises(StalenessError, match="allows versions 5..5"):
        check_versions([4], 5, 0)  # on-policy: only the current version


def _rl_rows(workdir):
    return [r for r in read_metrics(workdir / "metrics.jsonl") if r["stage"] == "rl"]


def _same_rows(a, b):
    timing = ("time_s", "_time", "compile")
    assert len(a) == len(b)
    for x, y in zip(a, b):
        keys = {k for k in x if not any(t in k for t in timing)}
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}


def test_stale_rollouts_with_tis_train_and_resume_bit_exactly(tmp_path, monkeypatch):
    """K = 2 with TIS: update t trains on rollouts of version max(t - 2, 0) (staleness
    0, 1, 2, 2), with real gradients and non-trivial weights; a run killed after update 3
    resumes from checkpoint 2 with its two pending rollouts and ends exactly as the
    uninterrupted one (metrics and parameters)."""
    config = rl_config(steps=4, max_staleness=2, off_policy_correction="tis", is_cap=1.2)
    straight = tmp_path / "straight"
    train_and_evaluate(config, str(straight))
    rows = _rl_rows(straight)
    assert [r["staleness"] for r in rows] == [0, 1, 2, 2]
    assert rows[0]["reward_std"] > 0 and any(r["grad_norm"] > 0 for r in rows)
    assert max(r["kl_behaviour"] for r in rows) > 0  # the weights are not all 1
    assert max(r["is_weight_max"] for r in rows) > 1.0
    for r in rows:
        assert {"is_weight_mean", "is_truncated_frac", "kl_behaviour"} <= set(r)

    workdir = tmp_path / "killed"
    killed_and_resumed(config, workdir, monkeypatch)
    _same_rows(_rl_rows(workdir), rows)
    assert_same_params(final_params(workdir), final_params(straight))


def test_a_split_mesh_samples_on_its_own_devices_and_equals_the_one_device_run(tmp_path):
    """mesh.rollout_devices: of 4 devices, 1 trains and 3 sample; the parameters reach the
    sampler by jax.device_put after every update, and the run's metrics equal the
    one-device pipelined run with the same K exactly. (Rows split over a different number
    of devices would sample with other float rounding: here the 16 rows do not divide 3 and
    every sampler device computes them all, as the one device does.)"""
    import jax

    from grpo_jax.runner import Run
    from grpo_jax.stages import KINDS

    rows = {}
    for name, devices, rollout in (("split", 4, 3), ("one", 1, 0)):
        config = rl_config(steps=3, max_staleness=1, off_policy_correction="mis")
        config.mesh.num_devices, config.mesh.rollout_devices = devices, rollout
        train_and_evaluate(config, str(tmp_path / name))
        rows[name] = _rl_rows(tmp_path / name)
    _same_rows(rows["split"], rows["one"])
    assert [r["staleness"] for r in rows["one"]] == [0, 1, 1]
    assert {"is_masked_frac", "kl_behaviour"} <= set(rows["one"][0])

    config.mesh.num_devices, config.mesh.rollout_devices = 4, 3
    run = Run(config, str(tmp_path / "probe"), KINDS)
    policy, params = run.sampler()
    sampler = {d.id for x in jax.tree.leaves(params) for d in x.devices()}
    trainer = {d.id for x in jax.tree.leaves(run.params) for d in x.devices()}
    assert sampler == {1, 2, 3} and trainer == {0} and policy is not run.policy
    assert run.sampler()[1] is params  # no new transfer until the parameters change
    run.close()


def test_ppo_takes_stale_rollouts_with_the_decoupled_correction(tmp_path):
    """PPO with K = 1 and the decoupled correction: staleness 0, 1, 1, the correction's
    metrics logged with weights that are not all 1 (the resume of the pending rollouts is
    the loop's, tested above with GRPO)."""
    from configs import default as default_config
    from grpo_jax.stages import default_section

    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.ppo = default_section("ppo")
    config.ppo.update(dict(steps=3, num_prompts=4, group_size=2, num_iterations=1,
                           num_minibatches=1, max_new_tokens=12, beta=0.1, checkpoint_every=0,
                           overlong_cache=8, max_staleness=1,
                           off_policy_correction="decoupled"))
    config.stages = "ppo"
    train_and_evaluate(config, str(tmp_path / "run"))
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["stage"] == "ppo"]
    assert [r["staleness"] for r in rows] == [0, 1, 1]
    assert all("is_weight_mean" in r and "kl_behaviour" in r for r in rows)
    assert max(r["kl_behaviour"] for r in rows) > 0 and rows[0]["kl_behaviour"] < 1e-9


def test_the_learner_reads_staleness_from_the_batch_versions():
    """`Learner.step`: staleness is the learner's version minus each row's `batch.version`
    (logged as its mean when the stage samples ahead), and the version counts the
    iteration, whatever state the iteration returns."""
    import types

    import jax.numpy as jnp

    from grpo_jax.runner.rl_loop import Learner

    class Stub(Learner):
        def iteration(self, state, batch):
            return {"params": state["params"] + 1.0}, {"loss": jnp.float32(0.0)}

    learner = Stub()
    batch = types.SimpleNamespace(version=jnp.array([5, 3, 4, 5], jnp.int32))
    state = {"params": jnp.float32(0.0), "version": jnp.int32(5)}
    new, metrics = learner.step(state, batch)
    assert int(new["version"]) == 6 and float(new["params"]) == 1.0
    assert "staleness" not in metrics  # an on-policy stage logs none
    learner.logs_staleness = True
    _, metrics = learner.step(state, batch)
    assert float(metrics["staleness"]) == 0.75  # (0 + 2 + 1 + 0) / 4
    # per-token versions (partial rollouts): the mean over the trained tokens only
    batch = types.SimpleNamespace(version=jnp.array([[5, 4, 0], [3, 3, 5]], jnp.int32),
                                  loss_mask=jnp.array([[True, True, False], [True, True, True]]))
    _, metrics = learner.step(state, batch)
    assert float(metrics["staleness"]) == pytest.approx((0 + 1 + 2 + 2 + 0) / 5)
