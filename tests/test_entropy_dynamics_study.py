"""entropy_dynamics: the fit of R = -a exp(H) + b against hand-computed values and data made
from known a and b, the curve's figures on constructed training rows, and the arms' configs
(one field apart, the shared runs' hashes)."""

from __future__ import annotations

import json
import math

import pytest

from grpo_jax.studies import common
from grpo_jax.studies import entropy_dynamics as study


def test_fit_recovers_known_a_and_b_from_data_made_with_them():
    a, b = 0.3, 0.9
    entropy = [0.05 * k for k in range(1, 9)]
    reward = [-a * math.exp(h) + b for h in entropy]
    fit = study.fit_entropy_law(entropy, reward)
    assert fit["a"] == pytest.approx(a, abs=1e-12)
    assert fit["b"] == pytest.approx(b, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert fit["ceiling"] == pytest.approx(b - a, abs=1e-12)
    assert fit["n"] == 8


def test_fit_with_noise_stays_near_the_known_coefficients():
    a, b = 0.5, 1.2
    entropy = [0.02 * k for k in range(20)]
    noise = [0.004 * (-1) ** k for k in range(20)]  # alternating, mean zero
    reward = [-a * math.exp(h) + b + e for h, e in zip(entropy, noise)]
    fit = study.fit_entropy_law(entropy, reward)
    assert fit["a"] == pytest.approx(a, abs=0.02)
    assert fit["b"] == pytest.approx(b, abs=0.02)
    assert 0.9 < fit["r2"] < 1.0


def test_fit_against_hand_computed_least_squares():
    # x = exp(H) = 1, 2, 3; R = 3, 2, 2: slope -1/2 (a = 1/2), b = 7/3 + 1/2 * 2 = 10/3,
    # residuals 1/6, -1/3, 1/6: SS_res 1/6, SS_tot 2/3, R^2 = 3/4; ceiling 10/3 - 1/2 = 17/6
    fit = study.fit_entropy_law([0.0, math.log(2.0), math.log(3.0)], [3.0, 2.0, 2.0])
    assert fit["a"] == pytest.approx(0.5)
    assert fit["b"] == pytest.approx(10.0 / 3.0)
    assert fit["r2"] == pytest.approx(0.75)
    assert fit["ceiling"] == pytest.approx(17.0 / 6.0)


def test_fit_is_zero_when_reward_rises_with_entropy():
    # the relation's direction fails: a = 0, b = mean(R), nothing explained
    fit = study.fit_entropy_law([0.1, 0.2, 0.3], [0.1, 0.2, 0.4])
    assert fit["a"] == 0.0
    assert fit["b"] == pytest.approx(0.7 / 3.0)
    assert fit["r2"] == pytest.approx(0.0, abs=1e-12)


def test_fit_needs_three_points_with_spread():
    assert math.isnan(study.fit_entropy_law([0.1, 0.2], [0.5, 0.4])["r2"])
    assert math.isnan(study.fit_entropy_law([0.1, 0.1, 0.1], [0.5, 0.4, 0.3])["r2"])
    assert math.isnan(study.fit_entropy_law([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])["r2"])
    fit = study.fit_entropy_law([0.1, None, 0.2, float("nan"), 0.3], [0.5, 0.1, 0.4, 0.2, 0.3])
    assert fit["n"] == 3 and fit["r2"] > 0.99


def test_windows_and_early_share():
    rows = [{"x": float(k)} for k in range(7)] + [{"x": None}]
    assert study.windows(rows, "x", 3) == [1.0, 4.0]  # the last, shorter window left out
    assert study.windows(rows[4:], "x", 2) == [4.5, 6.0]  # None left out of its window
    assert study.early_share(1.0, 0.4, 0.2) == pytest.approx(0.75)
    assert math.isnan(study.early_share(1.0, 0.4, 1.0))


def test_curve_values_on_rows_made_from_the_law():
    # 30 steps (3 windows of 10) whose entropy falls 0.4, 0.2, 0.1 (constant within a window,
    # so the window means keep the law exactly: mean(exp(H)) = exp(H)) and whose training
    # pass@1 follows R = -a exp(H) + b
    a, b = 0.6, 1.4
    entropy = [0.4] * 10 + [0.2] * 10 + [0.1] * 10
    rows = [{"entropy": h, "pass@1": -a * math.exp(h) + b} for h in entropy]
    values = study.curve_values(rows)
    assert values["fit_points"] == 3
    assert values["fit_r2"] == pytest.approx(1.0, abs=1e-9)
    assert values["fit_a"] == pytest.approx(a, abs=1e-9)
    assert values["fit_ceiling"] == pytest.approx(b - a, abs=1e-9)
    assert values["entropy_start"] == pytest.approx(0.4)
    end = sum(entropy[-10:]) / 10
    assert values["entropy_end"] == pytest.approx(end)
    assert values["entropy_ratio"] == pytest.approx(end / 0.4)
    early = sum(entropy[0:10]) / 10  # the window ending at a third of the steps
    assert values["entropy_drop_early"] == pytest.approx((early - 0.4) / (end - 0.4))
    assert values["ceiling_gap"] == pytest.approx(
        b - a - sum(r["pass@1"] for r in rows[-10:]) / 10)
    assert study.curve_values([]) == {}


def _flat(config) -> dict:
    def walk(node, prefix=""):
        out = {}
        for key, value in node.items():
            if isinstance(value, dict):
                out.update(walk(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out
    return walk(json.loads(config.to_json_best_effort(sort_keys=True)))


def test_arms_differ_in_one_field_and_share_the_other_studies_runs():
    from grpo_jax.studies import forking_tokens, updates_per_batch

    configs = study.arm_configs("full")
    assert common.config_hash(configs[study.GRPO]) == common.config_hash(
        forking_tokens.arm_config("all", "full"))
    assert common.config_hash(configs[study.PASSES]) == common.config_hash(
        updates_per_batch.arm_config(study.PASSES_ARM, "full"))
    for arm, control, field, value in (
            (study.BONUS, study.GRPO, "rl.entropy_coef", study.ENTROPY_COEF),
            (study.CLIP_HIGHER, study.PASSES, "rl.epsilon_high", study.EPSILON_HIGH)):
        left, right = _flat(configs[arm]), _flat(configs[control])
        differ = {k for k in set(left) | set(right) if left.get(k) != right.get(k)}
        assert differ == {field}, (arm, differ)
        assert left[field] == value
    with pytest.raises(ValueError, match="unknown arm"):
        study.arm_config("bogus")


def test_plot_fits_draws_each_arms_points_and_fit(tmp_path):
    entropy = [0.4, 0.3, 0.2, 0.15]
    points = {study.GRPO: [(entropy, [-0.5 * math.exp(h) + 1.2 for h in entropy])],
              study.BONUS: [([0.4, 0.39], [0.3, 0.31])]}  # too few points: no fit drawn
    study.plot_fits(points, str(tmp_path))
    assert (tmp_path / "fit.png").stat().st_size > 0
    study.plot_fits({}, str(tmp_path / "none"))  # no arm: no figure, no error
