"""test_time_scaling's own arithmetic against hand-computed values (the crossing of a curve
in log2 k, the exchange estimate, the per-problem curves and the geometric summary), and its
configs: the runs and bases it shares with pass_at_k and budget_forcing are theirs."""

from __future__ import annotations

import copy
import math

import pytest

from grpo_jax.studies import budget_forcing, common, pass_at_k
from grpo_jax.studies import test_time_scaling as tts

KS = (1, 2, 4, 8)
CURVE = (0.2, 0.4, 0.6, 0.8)


def test_crossing_is_linear_in_log2_k_between_the_points_around_it():
    # 0.5 lies halfway between 0.4 (k = 2) and 0.6 (k = 4): log2 k* = 1.5, k* = 2 ** 1.5
    assert tts.crossing_samples(KS, CURVE, 0.5) == pytest.approx(2 ** 1.5)
    # 0.45 a quarter of the way: log2 k* = 1.25
    assert tts.crossing_samples(KS, CURVE, 0.45) == pytest.approx(2 ** 1.25)
    # a measured point reached exactly is that k
    assert tts.crossing_samples(KS, CURVE, 0.6) == pytest.approx(4.0)


def test_crossing_at_the_first_point_beyond_the_last_and_on_a_curve_that_falls():
    assert tts.crossing_samples(KS, CURVE, 0.1) == 1.0  # the base already reaches it
    assert tts.crossing_samples(KS, CURVE, 0.2) == 1.0
    assert tts.crossing_samples(KS, CURVE, 0.9) is None  # never within the largest k
    assert tts.crossing_samples(KS, (0.2, 0.4, None, None), 0.5) is None  # not measured
    # the first crossing counts: up to 0.7 at k = 2, down, and up again
    assert tts.crossing_samples(KS, (0.3, 0.7, 0.4, 0.9), 0.5) == pytest.approx(
        2 ** (0.2 / 0.4))
    # an unmeasured point in the middle is skipped: the crossing is between k = 1 and 4
    assert tts.crossing_samples(KS, (0.2, None, 0.6, 0.8), 0.4) == pytest.approx(
        2 ** (0.5 * 2))


def test_exchange_converts_the_rl_pass_at_1_into_the_base_samples_and_tokens():
    base = {"pass": dict(zip(KS, CURVE)), "maj": dict(zip(KS, (0.2, 0.3, 0.4, 0.45))),
            "length": 20.0}
    rl = {"pass": {1: 0.5, 2: 0.7, 4: 0.8, 8: 0.9}, "length": 18.0}
    out = tts.exchange(base, rl, KS)
    assert out["k_pass"] == pytest.approx(2 ** 1.5)
    assert out["log2_k_pass"] == pytest.approx(1.5)
    assert out["tokens_pass"] == pytest.approx(2 ** 1.5 * 20.0)
    assert out["k_maj"] is None and out["tokens_maj"] is None  # 0.45 < 0.5 at k = 8
    assert out["rl_tokens"] == 18.0


def _problem(answers, correct, tokens):
    return {"operators": 2, "samples": len(answers), "correct": sum(correct),
            "formatted": len(answers), "tokens": tokens, "answers": answers,
            "correct_flags": "".join("1" if c else "0" for c in correct)}


def test_curves_from_counts_by_hand():
    # problem 1: 1 correct of 4 ("7"); votes 7, 3, 3, None
    # problem 2: 2 correct of 4 ("5"); votes 5, 5, 2, 9
    problems = tts.reduce_problems([
        _problem(["7", "3", "3", None], [True, False, False, False], 40),
        _problem(["5", "5", "2", "9"], [True, True, False, False], 24)], max_k=4)
    assert [p["distinct"] for p in problems] == [2, 3]
    curve = tts.curves(problems, (1, 2, 4))
    # pass@1 = mean(1/4, 2/4); pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2))
    assert curve["pass"][1] == pytest.approx((0.25 + 0.5) / 2)
    assert curve["pass"][2] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert curve["pass"][4] == pytest.approx(1.0)
    # maj@1 = pass@1 of the answered samples: problem 1 has 1 correct of 4, problem 2 2 of 4
    assert curve["maj"][1] == pytest.approx((0.25 + 0.5) / 2)
    # maj@4: problem 1's vote over all four is "3" (wrong); problem 2's is "5" (right)
    assert curve["maj"][4] == pytest.approx(0.5)
    assert curve["length"] == pytest.approx(64 / 8)
    assert curve["distinct"] == pytest.approx(2.5)


def test_maj_at_k_stops_at_the_largest_k_computed():
    problems = tts.reduce_problems([_problem(["1"] * 8, [True] * 8, 8)], max_k=4)
    assert sorted(problems[0]["maj"], key=int) == ["1", "2", "4"]
    assert tts.curves(problems, (1, 2, 4, 8))["maj"][8] is None


def test_geometric_summary_of_k():
    # log2 k of 1 and 3: geometric mean 2 ** 2 = 4; a run that never reaches it is left out
    found = tts._geometric([1.0, 3.0, None])
    assert found["n"] == 2 and found["mean"] == pytest.approx(4.0)
    lo, hi = found["ci95"]
    assert lo < 4.0 < hi and lo * hi == pytest.approx(16.0)  # symmetric in log2


def _resolved(config, init_from: str, seed: int = 0):
    config = common.for_tier(copy.deepcopy(config), "full")
    config.model.init_from, config.seed = init_from, seed
    return common.config_hash(config)


def test_the_rl_arm_is_pass_at_k_run_and_the_bases_are_budget_forcing_ones():
    base = {"roles": {"main": "/w/bases/main", "wait_redo": "/w/bases/wait"}}
    rl = tts.arm_config("full", tts.RL)
    tts.attach(rl, base)
    assert rl.model.init_from == "/w/bases/main"
    assert _resolved(rl, rl.model.init_from) == _resolved(pass_at_k.arm_config("full"),
                                                         "/w/bases/main")
    roles = budget_forcing.base_config("full")
    mine = tts.base_config("full")
    for role in ("main", "wait_redo"):
        assert common.config_hash(mine[role]) == common.config_hash(roles[role])


def test_the_e3_arm_is_budget_forcings_wait_seen_arm_at_the_training_budget():
    base = {"roles": {"main": "/w/bases/main", "wait_redo": "/w/bases/wait"}}
    e3 = tts.arm_config("full", tts.E3)
    tts.attach(e3, base)
    assert e3.model.init_from == "/w/bases/wait"
    assert e3.rl.max_new_tokens == tts.TRAIN_BUDGET
    seen = budget_forcing.arm_config("full", budget_forcing.SEEN)
    seen.rl.max_new_tokens = tts.TRAIN_BUDGET
    assert _resolved(e3, "/w/bases/wait") == _resolved(seen, "/w/bases/wait")
    assert max(b for _, _, b in tts.BUDGETS.values()) > tts.TRAIN_BUDGET


def test_a_bad_arm_is_one_line():
    with pytest.raises(ValueError, match="arm rl or e3, got 'nope'"):
        tts.arm_config("full", "nope")


def test_every_claimed_condition_is_measured_at_the_mini_tier():
    measured = {tts.budget_arm(model, c) for model, conditions in tts.MINI.items()
                for c in conditions}
    for claim in tts.CLAIMS:
        a, b, metric = claim.test
        if metric == "pass@1":
            assert {a, b} <= measured, claim.text
    assert all(math.isfinite(c.margin) for c in tts.CLAIMS)


def test_the_table_pairs_each_condition_with_its_models_reference(tmp_path):
    """e3's differences are to its training budget, the others' to unforced; the plot is
    written from the same arms."""
    def arm(pass1, length):
        return {"seeds": [0, 1], "bases": ["b", "b"],
                "metrics": {"pass@1": list(pass1), "mean_length": [length] * 2,
                            "format_rate": [1.0, 1.0]}}

    arms = {tts.budget_arm(tts.E3, "budget=32"): arm((0.40, 0.50), 30.0),
            tts.budget_arm(tts.E3, "budget=48"): arm((0.50, 0.62), 34.0),
            tts.budget_arm(tts.WAIT_BASE, "budget=32"): arm((0.20, 0.30), 28.0),
            tts.budget_arm(tts.WAIT_BASE, "unforced"): arm((0.30, 0.40), 31.0)}
    text = tts.table(arms, tts.KS)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line
            for line in text.splitlines() if line.startswith(("| e3", "| wait base"))}
    # e3 at 48 - e3 at 32: +10 and +12 points, mean +11.0; the reference row has none
    assert "| +11.0 [" in rows[("e3", "budget=48")]
    assert rows[("e3", "budget=32")].split("|")[4].strip() == "-"
    # the "Wait" base at 32 - unforced: -10 both seeds
    assert "-10.0" in rows[("wait base", "budget=32")]
    tts.plot(arms, tts.KS, str(tmp_path))
    assert (tmp_path / "test_time_scaling.png").exists()
