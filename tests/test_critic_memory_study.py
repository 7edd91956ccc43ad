"""critic_memory's own arithmetic against hand-computed values: the compiled program's device
total, a pytree's bytes, the PPO / GRPO ratio arms (paired by base and seed) and the arms'
configs (equal batches, the same update schedule, the two sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_jax.studies import critic_memory as cm


def test_device_bytes_counts_the_donated_outputs_once():
    # arguments 100 (of which 60 donated and returned in place), outputs 70, temporaries 30:
    # 100 + (70 - 60) + 30
    assert cm.device_bytes(100, 70, 60, 30) == 140


def test_tree_bytes_sums_every_leaf():
    tree = {"a": np.zeros((3, 4), np.float32), "b": [np.zeros(5, np.int8),
                                                     np.zeros((), np.float64)]}
    assert cm.tree_bytes(tree) == 3 * 4 * 4 + 5 + 8


def test_ratio_arms_pair_by_base_and_seed():
    def arm(seeds, device, time):
        n = len(seeds)
        return {"bases": [""] * n, "seeds": seeds,
                "metrics": {"device_bytes": device, "temp_bytes": device,
                            "trainable_bytes": [6.0] * n, "rss_added_bytes": [None] * n,
                            "step_time_s": time}}

    arms = {"PPO small": arm([1, 0], [300.0, 200.0], [3.0, 2.0]),
            "GRPO small": arm([0, 1, 2], [100.0, 150.0, 99.0], [1.0, 1.5, 9.0])}
    out = cm.ratio_arms(arms)
    assert list(out) == [cm.RATIO.format("small")]  # no large arms: no large ratio
    entry = out[cm.RATIO.format("small")]
    assert entry["seeds"] == [1, 0]  # PPO's order, seed 2 (GRPO's alone) left out
    # seed 1: 300 / 150; seed 0: 200 / 100; times 3 / 1.5 and 2 / 1
    assert entry["metrics"]["memory_ratio"] == pytest.approx([2.0, 2.0])
    assert entry["metrics"]["time_ratio"] == pytest.approx([2.0, 2.0])
    assert entry["metrics"]["memory_gap_bytes"] == pytest.approx([150.0, 100.0])
    assert entry["metrics"]["rss_ratio"] == [None, None]
    assert cm.ratio(1.0, 0.0) is None and cm.ratio(None, 2.0) is None


def test_arms_share_the_batch_and_schedule_and_differ_in_the_critic_and_size():
    configs = cm.arm_configs("full")
    ppo, grpo = configs["PPO small"], configs["GRPO small"]
    assert ppo.stages == "ppo" and grpo.stages == "rl"
    assert (ppo.ppo.num_prompts, ppo.ppo.group_size) == (grpo.rl.num_prompts,
                                                         grpo.rl.group_size)
    assert ppo.ppo.max_new_tokens == grpo.rl.max_new_tokens
    assert (ppo.ppo.num_iterations, ppo.ppo.num_minibatches) == (grpo.rl.num_iterations,
                                                                 grpo.rl.num_minibatches)
    assert ppo.ppo.beta > 0  # both hold a frozen reference
    # the sizes are the base's roles: the main base, and the large shape's short pretraining
    assert (ppo.model.init_from, configs["GRPO large"].model.init_from) == ("small", "large")
    roles = cm.base_config("full")
    assert roles["small"].model.name == "tiny-1m" and roles["small"].model.num_layers is None
    assert (roles["large"].model.name, roles["large"].model.num_layers) == ("tiny-10m", 4)
    assert list(cm.base_config("mini")) == ["small"]  # the mini tier runs the small size only
    config = cm.arm_config("PPO large")
    cm.attach(config, {"roles": {"small": "/s", "large": "/l"}})
    assert config.model.init_from == "/l"


def test_the_measuring_processes_rebuild_each_runs_config(tmp_path):
    from grpo_jax.studies import common

    bases = {"b": {"seed": 0, "workdir": "/s", "roles": {"small": "/s", "large": "/l"}}}
    for record in common.plan(cm.STUDY, "full", str(tmp_path), bases):
        rebuilt = cm.run_config(record.arm, "full", record.seed, record.config.model.init_from)
        assert common.config_hash(rebuilt) == common.config_hash(record.config)
        assert record.config.model.init_from == ("/l" if "large" in record.arm else "/s")


def test_the_timed_rounds_balance_which_arm_goes_first():
    # ABBA: P G | G P | P G ...; a round's first arm follows its own step of the round before
    assert cm.schedule(["P", "G"], 1, 2) == [["P", "G"], ["G", "P"], ["P", "G"]]
    for warmup, timed in cm.TIMING.values():
        rounds = cm.schedule(["P", "G"], warmup, timed)[warmup:]
        assert len(rounds) == timed
        assert sum(r[0] == "P" for r in rounds) == sum(r[0] == "G" for r in rounds)
    with pytest.raises(ValueError, match="even number"):
        cm.schedule(["P", "G"], 1, 7)


def test_the_growth_claim_is_not_testable_when_the_small_ratio_nears_two():
    from grpo_jax.studies import summary

    (claim,) = [c for c in cm.CLAIMS if c.test == (cm.LARGE, cm.SMALL, "memory_ratio")]
    arms = {cm.SMALL: {"bases": ["a", "b"], "seeds": [0, 0],
                       "metrics": {"memory_ratio": [1.95, 1.95]}}}
    headroom = summary.headroom_of(claim, arms)
    assert headroom == pytest.approx(0.05)
    contrast = {"metric": "memory_ratio", "diff": -0.02, "ci95": [-0.02, -0.02], "p": 0.0,
                "p_holm": 0.0, "per_base": {}}
    assert summary.verdict_of(claim, contrast, headroom)[0] == "not testable here"
    arms[cm.SMALL]["metrics"]["memory_ratio"] = [1.5, 1.5]  # room to grow: tested
    assert summary.verdict_of(claim, contrast, summary.headroom_of(claim, arms))[0] == \
        "not reproduced"
