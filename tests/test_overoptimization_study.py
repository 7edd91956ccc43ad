"""overoptimization: the fit of gold = g0 + d (alpha - beta_g ln d) against data made from known
coefficients and a hand-computed least squares, the peak's figures by hand, the distance and
the matched-KL reading on constructed training rows, and the arms' configs (reward_hacking's
run shared, the others one field apart)."""

from __future__ import annotations

import math

import pytest

from grpo_jax.studies import overoptimization as study
from grpo_jax.studies import reward_hacking
from grpo_jax.studies.configs import config_key

E = math.e


def test_fit_recovers_known_coefficients_from_data_made_with_them():
    g0, alpha, beta_g = 0.3, 0.2, 0.1
    d = [0.25 * k for k in range(12)]  # 0 ... 2.75
    gold = [g0 + study.gain(x, alpha, beta_g) for x in d]
    fit = study.fit_rl_form(d, gold)
    assert fit["g0"] == pytest.approx(g0, abs=1e-10)
    assert fit["alpha"] == pytest.approx(alpha, abs=1e-10)
    assert fit["beta_g"] == pytest.approx(beta_g, abs=1e-10)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-10)
    assert fit["n"] == 12 and fit["d_max"] == pytest.approx(2.75)
    # d* = exp(alpha / beta_g - 1) = e, inside the observed d; the gold gained there beta_g d*
    assert fit["d_star"] == pytest.approx(E, rel=1e-9)
    assert fit["gain_star"] == pytest.approx(0.1 * E, rel=1e-9)
    assert fit["peak_inside"] == 1.0


def test_fit_with_noise_stays_near_the_known_coefficients():
    g0, alpha, beta_g = 0.4, 0.15, 0.08
    d = [0.2 * k for k in range(1, 21)]
    noise = [0.002 * (-1) ** k for k in range(20)]  # alternating, mean zero
    gold = [g0 + study.gain(x, alpha, beta_g) + e for x, e in zip(d, noise)]
    fit = study.fit_rl_form(d, gold)
    assert fit["alpha"] == pytest.approx(alpha, abs=0.01)
    assert fit["beta_g"] == pytest.approx(beta_g, abs=0.01)
    assert 0.9 < fit["r2"] < 1.0


def test_fit_against_hand_computed_least_squares():
    # points d = 0, 1, 1, e: columns 1, d, -d ln d are (1,0,0), (1,1,0), (1,1,0), (1,e,-e).
    # g0 = 0, alpha = 1, beta_g = 1 give gold 0, 1, 1, 0; the residual (0, +1/2, -1/2, 0) is
    # orthogonal to the three columns, so least squares returns the coefficients exactly;
    # gold = 0, 1.5, 0.5, 0: mean 0.5, SS_tot 1.5, SS_res 0.5, R^2 = 2/3
    fit = study.fit_rl_form([0.0, 1.0, 1.0, E], [0.0, 1.5, 0.5, 0.0])
    assert fit["g0"] == pytest.approx(0.0, abs=1e-12)
    assert fit["alpha"] == pytest.approx(1.0)
    assert fit["beta_g"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(2.0 / 3.0)
    # d* = exp(1/1 - 1) = 1, gained 1 x 1; over [0, e] the curve rises 1 and falls to
    # R(e) = e (1 - 1) = 0: rise 1, fall 1
    assert fit["d_star"] == pytest.approx(1.0)
    assert fit["gain_star"] == pytest.approx(1.0)
    assert (fit["rise"], fit["fall"], fit["rise_fall"]) == pytest.approx((1.0, 1.0, 1.0))


def test_peak_by_hand():
    # alpha 2, beta_g 1: d* = e, R(d*) = e; R(e^2) = e^2 (2 - 2) = 0
    shape = study.peak(2.0, 1.0, E ** 2)
    assert shape["d_star"] == pytest.approx(E)
    assert shape["gain_star"] == pytest.approx(E)
    assert shape["peak_inside"] == 1.0
    assert (shape["rise"], shape["fall"], shape["rise_fall"]) == pytest.approx((E, E, E))
    # the peak past the observed d (alpha 3, beta_g 1: d* = e^2 > 2): rising only
    shape = study.peak(3.0, 1.0, 2.0)
    assert shape["peak_inside"] == 0.0 and shape["d_star"] == pytest.approx(E ** 2)
    assert shape["rise"] == pytest.approx(6.0 - 2.0 * math.log(2.0))
    assert shape["fall"] == 0.0 and shape["rise_fall"] == 0.0
    # beta_g < 0: no maximum (convex), R(2) = 2 + 0.5 x 2 ln 2 at the end: rising only
    shape = study.peak(1.0, -0.5, 2.0)
    assert math.isnan(shape["d_star"]) and shape["peak_inside"] == 0.0
    assert shape["rise"] == pytest.approx(2.0 + math.log(2.0))
    assert shape["rise_fall"] == 0.0
    # falling from the start (alpha -1, beta_g 0): the maximum is R(0) = 0, fall 1
    shape = study.peak(-1.0, 0.0, 1.0)
    assert (shape["rise"], shape["fall"], shape["rise_fall"]) == pytest.approx((0.0, 1.0, 0.0))


def test_fit_needs_four_points_with_spread():
    assert math.isnan(study.fit_rl_form([0.1, 0.2, 0.3], [0.5, 0.4, 0.3])["r2"])
    assert math.isnan(study.fit_rl_form([0.5] * 5, [0.1, 0.2, 0.3, 0.4, 0.5])["r2"])
    assert math.isnan(study.fit_rl_form([0.1, 0.2, 0.3, 0.4], [0.5] * 4)["r2"])
    fit = study.fit_rl_form([0.1, None, 0.2, float("nan"), 0.3, 0.5, -1.0],
                            [0.5, 0.1, 0.4, 0.2, 0.3, 0.2, 0.9])
    assert fit["n"] == 4 and math.isfinite(fit["r2"])


def test_best_of_n_form_r2():
    d = [0.5 * k for k in range(8)]
    assert study.fit_bon_r2(d, [0.2 + x * (0.3 - 0.1 * x) for x in d]) == pytest.approx(1.0)
    assert math.isnan(study.fit_bon_r2(d[:3], [0.1, 0.2, 0.3]))


def test_distances_windows_and_gold_at():
    rows = [{"kl_ref": 0.02, "completion_length": 50.0}, {"kl_ref": 0.0, "completion_length": 9},
            {"kl_ref": None, "completion_length": 9}, {"completion_length": 9}]
    d = study.distances(rows)
    assert d[:2] == pytest.approx([1.0, 0.0]) and math.isnan(d[2]) and math.isnan(d[3])
    assert study.windows([1.0, 2.0, 3.0, None, 5.0, 6.0, 7.0], 3) == [2.0, 5.5]
    assert study.window_of(80) == 10 and study.window_of(8) == 2 and study.window_of(2) == 1
    # first crossing of 0.5 between (0.2, 0.1) and (0.8, 0.4): 0.1 + 0.3 x 0.3 / 0.6 = 0.25
    assert study.gold_at([0.2, 0.8, 0.3, 1.0], [0.1, 0.4, 0.9, 0.2], 0.5) == pytest.approx(0.25)
    assert study.gold_at([0.6, 0.8], [0.3, 0.4], 0.5) == pytest.approx(0.3)  # the first point
    assert math.isnan(study.gold_at([0.2, 0.3], [0.3, 0.4], 0.5))
    assert study.matched_distance([0.9, None, 0.4, float("nan")]) == pytest.approx(0.4)


def test_curve_values_on_rows_made_from_the_form():
    # 40 steps (4 windows of 10), d constant within a window (0.5, 1, 2, 3: the sequence KL
    # d^2 as kl_ref x length 10), the gold on gold = 0.3 + d (0.2 - 0.1 ln d), the proxy
    # rising by 0.1 per window
    g0, alpha, beta_g = 0.3, 0.2, 0.1
    rows = []
    for k, x in enumerate((0.5, 1.0, 2.0, 3.0)):
        for _ in range(10):
            rows.append({"kl_ref": x * x / 10.0, "completion_length": 10.0,
                         study.GOLD: g0 + study.gain(x, alpha, beta_g),
                         study.PROXY: 0.1 * k})
    values = study.curve_values(rows, d_match=1.5)
    assert values["fit_alpha"] == pytest.approx(alpha, abs=1e-9)
    assert values["fit_beta_g"] == pytest.approx(beta_g, abs=1e-9)
    assert values["fit_r2"] == pytest.approx(1.0)
    assert values["d_final"] == pytest.approx(3.0) and values["d_max"] == pytest.approx(3.0)
    assert values["d_star"] == pytest.approx(E) and values["peak_inside"] == 1.0
    # rise: R(e) = 0.1 e; fall: 0.1 e - R(3) = 0.1 e - 3 (0.2 - 0.1 ln 3)
    fall = 0.1 * E - 3.0 * (0.2 - 0.1 * math.log(3.0))
    assert values["rise_fall"] == pytest.approx(min(0.1 * E, fall))
    assert values["rm_gain"] == pytest.approx(0.3)
    gold1, gold2 = (g0 + study.gain(x, alpha, beta_g) for x in (1.0, 2.0))
    assert values["gold_matched"] == pytest.approx((gold1 + gold2) / 2.0)
    start = g0 + study.gain(0.5, alpha, beta_g)
    assert values["gold_start"] == pytest.approx(start)
    assert values["gain_matched"] == pytest.approx((gold1 + gold2) / 2.0 - start)
    assert values["gold_gain"] == pytest.approx(g0 + study.gain(3.0, alpha, beta_g) - start)


def test_arms_share_reward_hackings_run_and_differ_only_in_beta():
    for tier in ("full", "mini"):
        configs = study.arm_configs(tier)
        assert configs[study.DEFAULT].rl.beta is None
        assert configs[study.LOW].rl.beta == 0.001 and configs[study.HIGH].rl.beta == 1.0
        for arm in (study.LOW, study.HIGH):
            other = configs[arm].copy_and_resolve_references()
            other.rl.beta = None
            assert config_key(other) == config_key(configs[study.DEFAULT])
    assert config_key(study.arm_config(study.DEFAULT)) == config_key(
        reward_hacking.arm_config(reward_hacking.MODEL))
    with pytest.raises(ValueError, match="unknown arm"):
        study.arm_config("beta=7")


def test_gold_matched_short_of_the_first_window_reads_from_the_first_step():
    # 8 rows, windows of 2: the first step at d = 0 (kl_ref 0) with gold 0.2, the second at
    # d = 1 with gold 0.6, then d = 2 with gold 0.4. The first window is (d 0.5, gold 0.4); the
    # matched d 0.25 lies between the first step and it: 0.2 + 0.2 x 0.25 / 0.5 = 0.3 (the
    # window points alone would give the first window's 0.4)
    rows = [{"kl_ref": 0.0, "completion_length": 10.0, study.GOLD: 0.2, study.PROXY: 0.0},
            {"kl_ref": 0.1, "completion_length": 10.0, study.GOLD: 0.6, study.PROXY: 0.0}]
    rows += [{"kl_ref": 0.4, "completion_length": 10.0, study.GOLD: 0.4, study.PROXY: 0.0}] * 6
    values = study.curve_values(rows, d_match=0.25)
    assert values["gold_start"] == pytest.approx(0.2)
    assert values["gold_matched"] == pytest.approx(0.3)
    assert values["gain_matched"] == pytest.approx(0.1)
