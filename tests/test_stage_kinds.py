"""Every stage kind through the pipeline; the RL kinds through the one shared loop, with the
same core record; PPO and TRPO batches sharded over the data axis give the same update."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from grpo_jax.checkpoint import Checkpointer
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import run_stage, train_and_evaluate
from grpo_jax.runner import CORE_METRICS
from grpo_jax.runner.rewards import REWARD_SOURCES
from grpo_jax.stages import KINDS, default_section

from configs import default as default_config


def digit_share(completion, example):
    """A reward that differs between samples of an untrained model (real advantages)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


@pytest.fixture
def varied_reward(monkeypatch):
    monkeypatch.setitem(REWARD_SOURCES, "digit_share", lambda run, section: digit_share)
    return {"accuracy": 1.0, "digit_share": 1.0}


def all_kinds_config(rewards, teacher: str):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    new = 16
    config.pretrain.steps = 2
    config.sft = default_section("sft")
    config.sft.update(dict(steps=1, batch_size=8, num_examples=16))
    config.rm = default_section("reward_model")
    config.rm.update(dict(num_pairs=16, eval_pairs=8, steps=1, batch_size=8))
    config.rl.update(dict(steps=1, num_prompts=4, group_size=4, beta=0.04, max_new_tokens=new))
    config.rl.rewards = rewards
    config.ppo = default_section("ppo")
    config.ppo.update(dict(steps=1, num_prompts=8, group_size=2, num_iterations=1,
                           num_minibatches=2, max_new_tokens=new, beta=0.05,
                           reward_model="rm"))
    config.ppo.rewards = {**rewards, "reward_model": 0.5}
    config.trpo = default_section("trpo")
    config.trpo.update(dict(steps=1, num_prompts=4, group_size=4, cg_iters=2,
                            max_new_tokens=new))
    config.trpo.rewards = rewards
    config.rejection_sft = default_section("rejection_sft")
    config.distill = default_section("distill")
    for name in ("rejection_sft", "distill"):
        config[name].update(dict(num_problems=4, num_samples=2, sample_batch_size=8,
                                 max_new_tokens=new, steps=1, batch_size=8))
    config.rejection_sft.mix_sft_examples = 8
    config.distill.student_model = "tiny-1m"
    config.opd = default_section("onpolicy_distill")
    config.opd.update(dict(steps=1, num_prompts=4, group_size=2, max_new_tokens=new,
                           teacher=teacher))
    config.stages = ("pretrain,sft,eval_base,rm,rl,ppo,trpo,opd,rejection_sft,distill,"
                     "eval_final")
    return config


def test_every_stage_kind_runs_one_step_in_one_run(tmp_path, varied_reward):
    teacher = default_config.get_config("smoke")  # another run: on-policy distillation's
    teacher.update(stages="pretrain", mesh={"num_devices": 1})
    teacher.model.num_layers = 1
    teacher.pretrain.steps = 1
    train_and_evaluate(teacher, str(tmp_path / "teacher"))
    config = all_kinds_config(varied_reward, str(tmp_path / "teacher"))
    tmp_path = tmp_path / "run"
    kinds = {config[name].kind for name in config.stages.split(",")}
    assert kinds == set(KINDS), "a new stage kind needs a step in this run"
    summary = train_and_evaluate(config, str(tmp_path))
    assert {"before", "after"} <= set(summary) and (tmp_path / "report.md").exists()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    for name in config.stages.split(","):
        assert any(r["stage"] == name for r in rows), name
    for name in ("rl", "ppo", "trpo"):
        (line,) = [r for r in rows if r["stage"] == name]
        missing = [k for k in CORE_METRICS if k not in line]
        assert not missing, (name, missing)
        assert all(np.isfinite(line[k]) for k in CORE_METRICS), (name, line)
        assert "reward/digit_share" in line and line["reward_std"] > 0  # real advantages
        # The trainer's log-probs of the sampled tokens equal the sampler's (float32 CPU).
        assert 0.0 <= line["logp_diff_mean"] <= line["logp_diff_max"] < 1e-4, (name, line)
    ppo_line = [r for r in rows if r["stage"] == "ppo"][0]
    assert "reward/reward_model" in ppo_line and ppo_line["kl_ref"] == pytest.approx(0, abs=1e-6)
    assert {"kl_step", "kl_coef", "value_loss"} <= set(ppo_line)
    trpo_line = [r for r in rows if r["stage"] == "trpo"][0]
    assert trpo_line["kl_step"] <= config.trpo.max_kl * (1 + 1e-4)
    rl_line = [r for r in rows if r["stage"] == "rl"][0]
    assert rl_line["kl_ref"] == pytest.approx(0.0, abs=1e-6) and "kl_step" not in rl_line
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        _, meta = ckpt.restore()
    assert meta["stage"] == "eval_final" and meta["model_name"] == "tiny-1m"


def _sharded_vs_single(tmp_path, config, name, monkeypatch, learner_cls):
    """(params on 8 devices, params on 1 device) after the stage; checks the batch the
    learner sees is split over the 8 devices of the data axis."""
    seen = []
    original = learner_cls.iterate

    def spy(self, batch, step):
        seen.append({k: getattr(batch, k).sharding for k in ("tokens", "loss_mask")})
        return original(self, batch, step)

    monkeypatch.setattr(learner_cls, "iterate", spy)
    results = []
    for devices in (0, 1):  # 0 = all 8 test devices, data axis 8
        config.mesh.num_devices = devices
        run = run_stage(config, name, tmp_path / f"devices{devices}")
        rows = [r for r in read_metrics(tmp_path / f"devices{devices}" / "metrics.jsonl")
                if r["stage"] == name]
        results.append((jax.device_get(run.params), rows))
    sharding = seen[0]["tokens"]
    assert len(sharding.device_set) == 8 and sharding.spec[0] in (("data", "fsdp"), "data")
    assert len(seen[-1]["tokens"].device_set) == 1
    (p8, rows8), (p1, rows1) = results
    for a, b in zip(rows8, rows1):
        assert a["reward_mean"] == b["reward_mean"]  # the same samples
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
    # One AdamW step moves a parameter by up to its learning rate whatever its gradient's
    # size, so a gradient near Adam's eps turns the two layouts' float rounding into a
    # visible difference: a tenth of the stage's first step (lr / 2 in the warm-up) is the
    # tolerance there, and everything else agrees to 1e-6 as before.
    atol = max(config[name].get("lr", 0.0) / 20, 1e-6)  # TRPO: no Adam, no lr
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=atol), p8, p1)
    loose = sum(int(np.sum(~np.isclose(x, y, rtol=1e-4, atol=1e-6)))
                for x, y in zip(jax.tree.leaves(p8), jax.tree.leaves(p1)))
    assert loose <= 1e-4 * sum(x.size for x in jax.tree.leaves(p8)), loose


def test_ppo_batches_are_sharded_and_give_the_single_device_update(tmp_path, monkeypatch,
                                                                  varied_reward):
    from grpo_jax.stages.ppo import PPOLearner

    config = default_config.get_config("smoke")
    config.model.num_layers = 1
    config.ppo = default_section("ppo")
    config.ppo.update(dict(steps=1, num_prompts=8, group_size=1, num_iterations=1,
                           num_minibatches=1, max_new_tokens=12, beta=0.1,
                           checkpoint_every=0))
    config.ppo.rewards = varied_reward
    _sharded_vs_single(tmp_path, config, "ppo", monkeypatch, PPOLearner)


def test_trpo_batches_are_sharded_and_give_the_single_device_update(tmp_path, monkeypatch,
                                                                   varied_reward):
    from grpo_jax.stages.trpo import TRPOLearner

    config = default_config.get_config("smoke")
    config.model.num_layers = 1
    config.trpo = default_section("trpo")
    config.trpo.update(dict(steps=1, num_prompts=4, group_size=4, cg_iters=2,
                            max_new_tokens=12, checkpoint_every=0))
    config.trpo.rewards = varied_reward
    _sharded_vs_single(tmp_path, config, "trpo", monkeypatch, TRPOLearner)
