"""DAPO's dynamic sampling, overlong handling and short runs of the GRPO family's variants."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from grpo_jax.runner import StageSpec, rollouts, sources
from grpo_jax.runner.rl_loop import LoopSettings
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rl.rollout import Rollout
from grpo_jax.tasks import get_task

from configs import default as default_config

N, G, NEW = 4, 3, 5


def fake_run():
    config = default_config.get_config("smoke")
    config.rl.num_prompts, config.rl.group_size, config.rl.max_sampling_rounds = N, G, 3
    run = types.SimpleNamespace(config=config, policy=None, params=None, tokenizer=None,
                                data_sharding=None, sampler=lambda: (None, None),
                                stage_key=lambda name, step: jax.random.key(len(name) * 100 + step))
    return run, StageSpec(0, "rl", config.rl, None)


def scripted_rollouts(monkeypatch, reward_rounds):
    """Makes the rollouts return the given per-round rewards [N*G] (lengths 1..NEW)."""
    calls = iter(reward_rounds)

    def fake_rollout(policy, params, tokenizer, examples, prompts, key, **kwargs):
        rewards = np.asarray(next(calls), np.float32)
        rows = len(examples)
        lengths = np.arange(rows) % NEW + 1
        mask = np.arange(NEW)[None] < lengths[:, None]
        return Rollout(
            prompt_tokens=np.zeros((rows, 4), np.int32), prompt_mask=np.ones((rows, 4), bool),
            tokens=np.ones((rows, NEW), np.int32), attention_mask=mask, loss_mask=mask,
            behaviour_logp=np.zeros((rows, NEW), np.float32), lengths=lengths,
            texts=[f"t{i}" for i in range(rows)], rewards=rewards,
            components={"accuracy": rewards.copy()}, truncated=lengths == NEW)

    monkeypatch.setattr(rollouts, "launch_rollout",
                        lambda *args, **kwargs: lambda: fake_rollout(*args, **kwargs))


def collect(run, stage, iterator, step, *, weights, dynamic, overlong_cache=0):
    """The host source's `collect(...)()` with the section's loop settings, these changed."""
    section = stage.section
    settings = LoopSettings(steps=section.steps, num_prompts=N, group_size=G,
                            rewards=tuple(weights.items()), checkpoint_every=1,
                            max_new_tokens=section.max_new_tokens,
                            overlong_cache=overlong_cache, dynamic_sampling=dynamic,
                            max_sampling_rounds=section.max_sampling_rounds)
    return sources.collect(run, stage, iterator, step, settings=settings, sampling=None,
                           reward_fns={})()


def prompts():
    examples = get_task("arithmetic").examples("train", 64, seed=0)
    return iter([examples[i:i + N] for i in range(0, len(examples), N)])


def test_dynamic_sampling_keeps_only_groups_with_signal(monkeypatch):
    run, stage = fake_run()
    # Groups (of G=3): round 1 has signal in groups 0 and 2; round 2 in groups 1, 2 and 3.
    round1 = [1, 0, 0,  1, 1, 1,  0, 1, 0,  0, 0, 0]
    round2 = [0, 0, 0,  1, 0, 1,  0, 0, 1,  1, 1, 0]
    scripted_rollouts(monkeypatch, [round1, round2])
    ro, examples, info = collect(run, stage, prompts(), 0, weights={"accuracy": 1.0},
                                  dynamic=True)
    groups = ro.rewards.reshape(N, G)
    assert np.all(groups.std(axis=1) > 0)  # never a zero-variance group
    np.testing.assert_array_equal(groups, [[1, 0, 0], [0, 1, 0], [1, 0, 1], [0, 0, 1]])
    assert info == {"sampling_rounds": 2, "dropped_groups": 2 + 1, "filled_groups": 0}
    assert len(examples) == N * G and ro.attention_mask.shape == (N * G, NEW)


def test_dynamic_sampling_terminates_and_masks_the_shortfall(monkeypatch):
    run, stage = fake_run()
    constant = [1.0] * (N * G)
    one_good = [1, 0, 0] + [0.0] * (N * G - G)
    scripted_rollouts(monkeypatch, [one_good, constant, constant, constant])
    ro, _, info = collect(run, stage, prompts(), 0, weights={"accuracy": 1.0}, dynamic=True)
    assert info["sampling_rounds"] == 3  # the bound, not an endless loop
    assert info["filled_groups"] == N - 1
    # filler rows carry no loss
    assert ro.attention_mask[:G].any() and not ro.attention_mask[G:].any()
    assert ro.rewards.shape == (N * G,)


def test_static_sampling_takes_one_round(monkeypatch):
    run, stage = fake_run()
    scripted_rollouts(monkeypatch, [[1.0] * (N * G)])
    ro, _, info = collect(run, stage, prompts(), 0, weights={"accuracy": 1.0}, dynamic=False)
    assert info == {"sampling_rounds": 1} and np.all(ro.rewards == 1.0)


def test_soft_overlong_punishment_is_added_per_length(monkeypatch):
    run, stage = fake_run()
    stage.section.max_new_tokens = NEW
    scripted_rollouts(monkeypatch, [[0.0] * (N * G)])
    ro, _, _ = collect(run, stage, prompts(), 0, weights={"accuracy": 1.0, "overlong": 0.5},
                        dynamic=False, overlong_cache=2)
    # L_max = 5, L_cache = 2: lengths 1..3 -> 0, 4 -> -0.5, 5 -> -1; weight 0.5.
    expected = {1: 0.0, 2: 0.0, 3: 0.0, 4: -0.25, 5: -0.5}
    for length, reward in zip(ro.lengths, ro.rewards):
        assert reward == pytest.approx(expected[int(length)])


@pytest.mark.parametrize("overrides", [
    {"algorithm": "dapo"},
    {"algorithm": "gspo", "num_iterations": 2},
    {"algorithm": "grpo", "ref_reset_every": 1, "beta": 0.04},
    {"algorithm": "reinforce_pp"},
    {"algorithm": "cispo", "num_iterations": 2},  # a second pass: ratios leave 1
    {"algorithm": "grpo", "entropy_coef": 0.01},
])
def test_one_step_smoke(tmp_path, overrides):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.stages = "rl"
    config.rl.steps = 2
    # The soft overlong punishment makes rewards differ within groups (completions that end
    # early against those cut at 12 tokens): real gradients. Groups of 8 make a step whose
    # every group ended alike unlikely.
    config.rl.max_new_tokens, config.rl.overlong_cache = 12, 8
    config.rl.group_size = 8
    for key, value in overrides.items():
        config.rl[key] = value
    train_and_evaluate(config, str(tmp_path))
    lines = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert len(lines) == 2
    for line in lines:  # real gradients: some group's rewards differ
        assert np.isfinite(line["loss"]) and line["grad_norm"] > 0
        assert line.get("zero_std_groups", 0.0) < 1.0
    if overrides["algorithm"] == "reinforce_pp":
        # The KL is in the reward, measured at the rollout's parameters: the reference's at
        # step 1, the policy after one update (the warm-up's lr / 2) at step 2.
        assert lines[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
        assert lines[1]["kl_ref"] > 1e-6
        assert lines[0]["logp_diff_max"] < 1e-4  # the recomputed log-probs are the sampler's
    if overrides["algorithm"] == "dapo":
        assert all(line["sampling_rounds"] >= 1 for line in lines)
    if "ref_reset_every" in overrides:
        # The reference is reset to the policy before step 2, so its KL is 0 again there
        # (the policy moved at step 1: without the reset it would not be).
        assert lines[1]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
