"""The forgetting study's arms and its arithmetic (the correlation, the law's slope through the
origin, the per-completion KL, the old-task pass rate, the measurement keys), by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_jax.studies import forgetting, update_sparsity
from grpo_jax.studies.configs import config_key


def test_the_arms_share_one_budget_on_the_new_task():
    configs = forgetting.arm_configs("full")
    assert tuple(configs) == forgetting.ARMS
    for config in configs.values():
        assert config.task.kwargs.operators == forgetting.NEW
        assert config.model.init_from == ""  # the base, set per base by the study
    grpo, sft, low = configs["grpo"], configs["sft"], configs["sft_low_lr"]
    assert grpo.stages == "eval_base,rl,eval_final"
    assert sft.stages == low.stages == "eval_base,sft,eval_final"
    sequences = grpo.rl.num_prompts * grpo.rl.group_size
    for config in (sft, low):  # update_sparsity's pairing: steps, sequences per step
        assert (config.sft.steps, config.sft.batch_size) == (grpo.rl.steps, sequences)
    assert sft.sft.lr == grpo.rl.lr
    assert low.sft.lr == pytest.approx(grpo.rl.lr * 0.125)
    # grpo and sft are update_sparsity's arms on the new task: one config, whoever asks
    shared = update_sparsity.arm_config(update_sparsity.SFT, "full")
    shared.task.kwargs.operators = "+-"
    assert config_key(shared) == config_key(sft)
    assert len({config_key(c) for c in configs.values()}) == 3


def test_an_unknown_arm_is_one_line():
    with pytest.raises(ValueError, match=r"^forgetting: unknown arm 'ppo'; expected one of "):
        forgetting.arm_config("ppo")


def test_pearson_by_hand():
    # x = 1, 2, 3; y = 1, 3, 2: means 2, 2; sxy = (-1)(-1) + 0 + (1)(0) = 1; sxx = syy = 2
    assert forgetting.pearson([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    assert forgetting.pearson([1.0, 2.0, 3.0], [6.0, 4.0, 2.0]) == pytest.approx(-1.0)
    # a None pair is left out; fewer than three pairs, or no spread: None
    assert forgetting.pearson([1.0, None, 2.0, 3.0], [1.0, 9.0, 3.0, 2.0]) == pytest.approx(0.5)
    assert forgetting.pearson([1.0, 2.0], [1.0, 2.0]) is None
    assert forgetting.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


def test_law_slope_through_the_origin_by_hand():
    # sum(kl * drop) = 1*0.02 + 2*0.03 = 0.08; sum(kl^2) = 1 + 4 = 5: b = 0.016
    assert forgetting.law_slope([1.0, 2.0], [0.02, 0.03]) == pytest.approx(0.016)
    assert forgetting.law_slope([1.0, None, 2.0], [0.02, 0.5, 0.03]) == pytest.approx(0.016)
    assert forgetting.law_slope([0.0], [0.1]) is None
    assert forgetting.law_slope([], []) is None


def test_sequence_kl_by_hand():
    token_kl = np.array([[0.1, 0.2, 9.0], [0.3, 9.0, 9.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    out = forgetting.sequence_kl(token_kl, mask)
    # completions: 0.1 + 0.2 = 0.3 and 0.3, mean 0.3; tokens: 0.6 over 3
    assert out["per_completion"] == pytest.approx(0.3)
    assert out["per_token"] == pytest.approx(0.2)
    assert out["tokens"] == 3


def test_pass_rate_by_hand():
    problems = [{"correct": 3, "samples": 4}, {"correct": 0, "samples": 4}]
    assert forgetting.pass_rate(problems) == pytest.approx(3 / 8)
    assert forgetting.pass_rate(None) is None and forgetting.pass_rate([]) is None


def test_every_measurement_samples_with_its_own_key():
    keys = [forgetting.measurement_key(base, seed, arm, purpose)
            for base in (0, 1) for seed in (0, 1) for arm in forgetting.ARM_CODES
            for purpose in forgetting.PURPOSES]
    assert len(set(keys)) == len(keys)  # no two policies, purposes or pairs share one
    assert keys[0] == forgetting.measurement_key(0, 0, "base", "old")  # and reproducible
    assert all(0 <= k < 2 ** 31 for k in keys)


def test_the_claims_margins_and_ceilings():
    by_test = {c.test: c for c in forgetting.CLAIMS}
    drop = by_test[("grpo", "sft", "pass@1_old_drop")]
    assert (drop.expect, drop.margin, drop.headroom) == ("<", 0.03, ("base", "pass@1_old", 0.0))
    law = by_test[("forgetting law", "no relation", "r_drop_kl")]
    assert (law.expect, law.margin) == (">", 0.5)
    kl = by_test[("grpo", "sft", "log_kl_forward")]
    assert (kl.expect, kl.margin) == ("<", pytest.approx(math.log(2.0)))
    same = by_test[("grpo", "sft law at grpo's kl", "pass@1_old_drop")]
    assert (same.expect, same.margin) == ("=", 0.03)


def _values(drop, kl, base_old=0.5, base_new=0.3, new=0.4):
    return {"pass@1": new, "base_pass@1": base_new, "base_pass@1_old": base_old,
            "pass@1_old": base_old - drop, "pass@1_old_drop": drop, "kl_forward": kl,
            "kl_reverse": kl}


def test_the_law_arms_by_hand():
    rows = {("grpo", "b0", 0): _values(0.01, 1.0), ("sft", "b0", 0): _values(0.03, 3.0),
            ("sft_low_lr", "b0", 0): _values(0.02, 2.0),
            ("grpo", "b0", 1): _values(0.00, 1.0), ("sft", "b0", 1): _values(0.01, 2.0),
            ("sft_low_lr", "b0", 1): _values(0.03, 3.0)}
    arms, slopes = forgetting.arms_of(rows)
    assert list(arms) == ["base", "grpo", "sft", "sft_low_lr", "forgetting law", "no relation",
                          "sft law at grpo's kl"]
    for entry in arms.values():
        assert entry["bases"] == ["b0", "b0"] and entry["seeds"] == [0, 1]
    # seed 0: drop = kl / 100 exactly, r = 1; seed 1: kl 1, 2, 3 against drop 0, 1, 3 (in
    # hundredths): sxy = (-1)(-4/3) + 0 + (1)(5/3) = 3, sxx = 2, syy = 16/9 + 1/9 + 25/9 = 42/9
    law = arms["forgetting law"]["metrics"]["r_drop_kl"]
    assert law[0] == pytest.approx(1.0)
    assert law[1] == pytest.approx(3 / math.sqrt(2 * 42 / 9))
    assert arms["no relation"]["metrics"]["r_drop_kl"] == [0.0, 0.0]
    # each (base, seed) fits its own line to its two SFT runs: seed 0 kl 3, 2 against drop
    # 0.03, 0.02: sum(kl * drop) = 0.09 + 0.04 = 0.13, sum(kl^2) = 13: b = 0.01; seed 1 kl
    # 2, 3 against drop 0.01, 0.03: 0.02 + 0.09 = 0.11 over 13
    assert slopes == pytest.approx({"b0,seed=0": 0.01, "b0,seed=1": 0.11 / 13})
    assert arms["sft law at grpo's kl"]["metrics"]["pass@1_old_drop"] == pytest.approx(
        [0.01, 0.11 / 13])  # grpo's kl is 1 on both seeds
    assert arms["base"]["metrics"]["pass@1_old"] == [0.5, 0.5]
    assert "base_pass@1_old" not in arms["grpo"]["metrics"]
