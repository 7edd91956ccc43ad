"""Designs where a study's mechanism can act: kl_beta's per-(base, seed) measurement keys,
trpo_vs_ppo's claims as the abstract states them, one_shot's selection of its one problem by
the historical variance score, expert_iteration's recipe chosen on a validation split and its
RL - SFT contrast. No runs here: configs, claims and the selection rules on constructed
inputs (the mini tiers run in tests/test_studies.py)."""

from __future__ import annotations

import json
import re

import pytest

from grpo_jax.studies import kl_beta, trpo_vs_ppo

# Schulman et al. 2017, arXiv:1707.06347, the abstract as published.
PPO_ABSTRACT = (
    "We propose a new family of policy gradient methods for reinforcement learning, which "
    "alternate between sampling data through interaction with the environment, and "
    "optimizing a \"surrogate\" objective function using stochastic gradient ascent. Whereas "
    "standard policy gradient methods perform one gradient update per data sample, we propose "
    "a novel objective function that enables multiple epochs of minibatch updates. The new "
    "methods, which we call proximal policy optimization (PPO), have some of the benefits of "
    "trust region policy optimization (TRPO), but they are much simpler to implement, more "
    "general, and have better sample complexity (empirically). Our experiments test PPO on a "
    "collection of benchmark tasks, including simulated robotic locomotion and Atari game "
    "playing, and we show that PPO outperforms other online policy gradient methods, and "
    "overall strikes a favorable balance between sample complexity, simplicity, and "
    "wall-time.")


# ---- kl_beta ----------------------------------------------------------------------------------

def test_kl_measurement_keys_are_paired_within_a_base_seed_and_distinct_across():
    full = [(base, seed) for base in (0, 1, 2, 3) for seed in (0, 1)]
    keys = [kl_beta.measurement_seed(b, s) for b, s in full]
    base_keys = [kl_beta.measurement_seed(b) for b in (0, 1, 2, 3)]
    assert len(set(keys + base_keys)) == len(keys) + len(base_keys)
    assert keys == [kl_beta.measurement_seed(b, s) for b, s in full]  # a pure function
    assert all(0 <= k < 2 ** 31 for k in keys + base_keys)
    assert kl_beta.KEY not in keys  # not the one key every policy shared


def test_a_kl_json_made_with_another_key_is_measured_again(tmp_path):
    path = str(tmp_path / "kl.json")
    assert not kl_beta._measured_with(path, 7)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"key": kl_beta.KEY, "exact_kl": 0.04}, f)
    assert not kl_beta._measured_with(path, kl_beta.measurement_seed(0, 0))
    assert kl_beta._measured_with(path, kl_beta.KEY)


# ---- trpo_vs_ppo ------------------------------------------------------------------------------

def test_trpo_vs_ppo_claims_quote_the_abstract():
    assert trpo_vs_ppo.CLAIMS
    for claim in trpo_vs_ppo.CLAIMS:
        assert "abstract (quotation)" in claim.source
        for part in claim.text.split("[...]"):
            assert part.strip() in PPO_ABSTRACT, part
        assert claim.margin and claim.can_fail
    assert not any("stabil" in c.text.lower() for c in trpo_vs_ppo.CLAIMS)
    # the learning-rate question stays a contrast of the study, without a verdict
    assert ("PPO lr 2e-3", trpo_vs_ppo.PPO, "pass@1") in trpo_vs_ppo.SPECS
