"""grpo_jax.stats (the one statistics module of sweeps and studies) against hand-computed
values and, where installed, scipy; and the summary.json schema of grpo_jax.studies.summary."""

import json
import math

import pytest

from grpo_jax import stats
from grpo_jax.studies import summary as summary_lib


def test_t_distribution_closed_forms():
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t) / pi.
    for t in (-3.0, -0.5, 0.0, 0.7, 12.7):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-10)
    # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)); its 0.975 quantile is 4.302652729...
    for t in (-2.0, 0.3, 3.4641016):
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)),
                                                  abs=1e-12)
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302652729911275, rel=1e-10)
    # standard t tables' values (3 decimals)
    for df, value in ((3, 3.182), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert stats.t_quantile(0.975, df) == pytest.approx(value, abs=6e-4)
    assert stats.t_quantile(0.025, 5) == pytest.approx(-stats.t_quantile(0.975, 5))


T975_2 = 4.302652729911275  # Student's t 0.975 quantile, 2 degrees of freedom


def test_interval_by_hand():
    """mean, std (n - 1), n and the 95% t interval, in that key order (a sweep's
    summary.json figure); missing, non-finite and boolean values left out."""
    out = stats.interval([0.5, 0.6, 0.7])
    assert list(out) == ["mean", "std", "n", "ci95"]
    assert out["mean"] == pytest.approx(0.6) and out["n"] == 3
    assert out["std"] == pytest.approx(0.1)  # sqrt(((0.1)^2 + 0 + (0.1)^2) / 2)
    half = T975_2 * 0.1 / math.sqrt(3)
    assert out["ci95"] == pytest.approx([0.6 - half, 0.6 + half], rel=1e-9)
    assert stats.interval([0.5, None, 0.6, float("nan"), float("inf"), True, 0.7]) == out
    one = stats.interval([1.0])
    assert one["n"] == 1 and one["mean"] == 1.0 and math.isnan(one["std"])
    assert all(math.isnan(x) for x in one["ci95"])
    empty = stats.interval([])
    assert empty["n"] == 0 and math.isnan(empty["mean"]) and math.isnan(empty["std"])
    # mean_interval is interval with the one-sample test added
    with_p = stats.mean_interval([0.5, 0.6, 0.7])
    assert list(with_p) == ["n", "mean", "std", "ci95", "p"]
    assert {k: with_p[k] for k in out} == out


def test_paired_interval_by_hand():
    """Differences per seed: [0.1, 0.15, 0.05], mean 0.1, std 0.05, half-width
    t(2) * 0.05 / sqrt(3); a pair with a missing side is left out. Unpaired, the same
    numbers' intervals overlap (the seeds' shared spread is not cancelled)."""
    arm, base = [0.5, 0.6, 0.7, None], [0.4, 0.45, 0.65, 0.3]
    out = stats.paired_interval(arm, base)
    assert list(out) == ["mean", "std", "n", "ci95"]
    assert out["n"] == 3 and out["mean"] == pytest.approx(0.1)
    assert out["std"] == pytest.approx(0.05)
    half = T975_2 * 0.05 / math.sqrt(3)
    assert out["ci95"] == pytest.approx([0.1 - half, 0.1 + half], rel=1e-9)
    assert stats.interval(arm)["ci95"][0] < stats.interval(base)["ci95"][1]
    # the same interval as the paired test's; lists of different lengths are cut to the
    # shorter one here (paired refuses them)
    assert out["ci95"] == stats.paired(arm, base)["ci95"]
    assert stats.paired_interval(arm + [0.9], base) == out


def test_paired_by_hand():
    # differences 1, 2, 3: mean 2, std 1, t = 2 sqrt(3) on 2 df,
    # p = 1 - t / sqrt(2 + t^2) (df = 2), half-width 4.30265 / sqrt(3)
    out = stats.paired([1.0, 2.5, 3.0], [0.0, 0.5, 0.0])
    assert out["n"] == 3 and out["diff"] == pytest.approx(2.0)
    assert out["std"] == pytest.approx(1.0)
    t = 2 * math.sqrt(3)
    assert out["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    half = 4.302652729911275 / math.sqrt(3)
    assert out["ci95"] == pytest.approx([2 - half, 2 + half], rel=1e-9)


def test_paired_leaves_out_missing_pairs_and_edge_cases():
    out = stats.paired([1.0, None, 3.0, float("nan")], [0.0, 1.0, 1.0, 2.0])
    assert out["n"] == 2 and out["diff"] == pytest.approx(1.5)
    assert math.isnan(stats.paired([1.0], [0.0])["p"])
    assert stats.paired([1.0, 1.0], [0.0, 0.0])["p"] == 0.0  # no spread, nonzero mean
    assert stats.paired([1.0, 1.0], [1.0, 1.0])["p"] == 1.0
    with pytest.raises(ValueError):
        stats.paired([1.0], [1.0, 2.0])


def test_holm_by_hand():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = stats.holm([0.01, float("nan"), 0.02])  # NaN stays NaN, m = 2
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1])
    assert adjusted[2] == pytest.approx(0.02)
    assert stats.holm([]) == []


def test_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 9, 29, 100, 2.5):
        for q in (0.6, 0.9, 0.975, 0.995):
            assert stats.t_quantile(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-9)
        for t in (-4.0, -1.0, 0.2, 2.0, 7.5):
            assert stats.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-12)
    a = [0.51, 0.48, 0.55, 0.50, 0.47]
    b = [0.49, 0.47, 0.50, 0.51, 0.44]
    out = stats.paired(a, b)
    reference = scipy_stats.ttest_rel(a, b)
    assert out["p"] == pytest.approx(reference.pvalue, rel=1e-9)
    low, high = scipy_stats.t.interval(0.95, 4, loc=out["diff"],
                                       scale=scipy_stats.sem([x - y for x, y in zip(a, b)]))
    assert out["ci95"] == pytest.approx([low, high], rel=1e-9)
    for values in (a, [0.3, 0.9], [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]):
        n = len(values)
        mean = sum(values) / n
        low, high = scipy_stats.t.interval(0.95, n - 1, loc=mean, scale=scipy_stats.sem(values))
        assert stats.interval(values)["ci95"] == pytest.approx([low, high], rel=1e-9)
    for f, df1, df2 in ((2.3, 1, 4), (0.7, 3, 17), (11.0, 2, 6)):
        assert stats.f_sf(f, df1, df2) == pytest.approx(scipy_stats.f.sf(f, df1, df2),
                                                        rel=1e-9)
    # the base x arm interaction is the one-way ANOVA of the paired differences by base
    pairs = {"b0": ([0.5, 0.6, 0.8], [0.1, 0.3, 0.2]), "b1": ([0.4, 0.45, 0.5], [0.4, 0.3, 0.5]),
             "b2": ([0.9, 0.7], [0.2, 0.1])}
    diffs = [[x - y for x, y in zip(a, b)] for a, b in pairs.values()]
    reference = scipy_stats.f_oneway(*diffs)
    found = stats.nested(pairs)["interaction"]
    assert (found["df1"], found["df2"]) == (2, 5)
    assert found["F"] == pytest.approx(reference.statistic, rel=1e-9)
    assert found["p"] == pytest.approx(reference.pvalue, rel=1e-9)


def test_interaction_by_hand():
    # differences +1, +1 on one base and +3, +5 on the other: grand mean 2.5, between
    # 2 * (1 - 2.5)^2 + 2 * (4 - 2.5)^2 = 9 on 1 df, within 0 + 2 = 2 on 2 df: F = 9
    found = stats.interaction({"a": ([2.0, 3.0], [1.0, 2.0]), "b": ([3.0, 5.0], [0.0, 0.0])})
    assert (found["F"], found["df1"], found["df2"]) == (9.0, 1, 2)
    # F(1, 2) is T^2 with T ~ t(2), whose tail is P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2
    assert found["p"] == pytest.approx(1 - 3 / 11 ** 0.5)
    assert math.isnan(stats.interaction({"a": ([1.0, 2.0], [0.0, 0.0])})["p"])


def test_holm_against_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    ps = [0.001, 0.2, 0.013, 0.04, 0.03, 0.6]
    reference = multitest.multipletests(ps, method="holm")[1]
    assert stats.holm(ps) == pytest.approx(list(reference))


def test_nested_bases_as_blocks():
    one = stats.nested({"b0": ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])})
    assert one["unit"] == "seed" and one["n"] == 3 and one["diff"] == pytest.approx(2.0)
    assert one["df"] == 2 and math.isnan(one["between_base_sd"])
    assert one["ci95"] == pytest.approx(stats.paired([1.0, 2.0, 3.0], [0.0] * 3)["ci95"])
    two = stats.nested({"b0": ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]),
                        "b1": ([0.5, 0.5], [0.0, 0.5])})
    # per base: 2.0 and 0.25; the blocked estimate is the mean of the two: 1.125
    assert two["unit"] == "seed in base" and two["n"] == 5 and two["df"] == 3
    assert two["per_base"]["b0"]["diff"] == pytest.approx(2.0)
    assert two["per_base"]["b1"]["diff"] == pytest.approx(0.25)
    assert two["diff"] == pytest.approx(1.125)
    # within-base residuals: SS = 2 + 0.125 on 5 - 2 = 3 df; se = s sqrt(1/3 + 1/2) / 2
    s = math.sqrt(2.125 / 3)
    half = 3.182446305284263 * s * math.sqrt(1 / 3 + 1 / 2) / 2
    assert two["ci95"] == pytest.approx([1.125 - half, 1.125 + half], rel=1e-9)
    # the same as least squares of the differences on an intercept and a sum-coded block
    np = pytest.importorskip("numpy")
    d = np.array([1.0, 2.0, 3.0, 0.5, 0.0])
    x = np.stack([np.ones(5), np.array([1.0, 1, 1, -1, -1])], 1)
    coef, residual, *_ = np.linalg.lstsq(x, d, rcond=None)
    cov = residual[0] / 3 * np.linalg.inv(x.T @ x)
    assert two["diff"] == pytest.approx(coef[0])
    assert (two["ci95"][1] - two["diff"]) / 3.182446305284263 == pytest.approx(
        math.sqrt(cov[0, 0]))
    # the other reading: each base one observation (1 df), its spread between bases
    assert two["across_bases"]["n"] == 2
    assert two["between_base_sd"] == pytest.approx(math.sqrt(2) * 0.875)
    across = 12.706204736174705 * two["between_base_sd"] / math.sqrt(2)
    assert two["across_bases"]["ci95"] == pytest.approx([1.125 - across, 1.125 + across],
                                                        rel=1e-6)


def _example():
    arms = {"base": {"seeds": [0, 1, 2], "bases": ["b", "b", "b"],
                     "metrics": {"pass@1": [0.30, 0.32, 0.31]}},
            "arm1": {"seeds": [0, 1, 2], "bases": ["b", "b", "b"],
                     "metrics": {"pass@1": [0.40, 0.41, 0.45]}},
            "arm2": {"seeds": [0, 1], "bases": ["b", "b"],
                     "metrics": {"pass@1": [0.31, None]}}}
    provenance = {"commit": "abc", "dirty": False, "python": "3", "jax": "j", "flax": "f",
                  "argv": [], "wall_time_s": 1.0}
    protocol = {"eval_seed": 0, "problems": 128, "samples_per_problem": 8,
                "problems_fixed_across_seeds": True}
    return summary_lib.build(study="x", tier="mini", provenance=provenance, protocol=protocol,
                             arms=arms, specs=[("arm1", "base", "pass@1"),
                                               ("arm2", "base", "pass@1")])


def test_summary_schema_contrasts_and_markers():
    result = _example()
    first, second = result["contrasts"]
    assert first["n"] == 3 and first["diff"] == pytest.approx(
        stats.paired([0.40, 0.41, 0.45], [0.30, 0.32, 0.31])["diff"])
    assert first["p_holm"] == pytest.approx(first["p"])  # the only p in the family
    assert second["n"] == 1 and math.isnan(second["p"])  # seed 1 of arm2 has no value
    text = summary_lib.to_json(result)
    loaded = json.loads(text)  # non-finite numbers are null
    summary_lib.check(loaded)
    assert loaded["contrasts"][1]["p"] is None
    broken = dict(loaded)
    del broken["provenance"]
    with pytest.raises(ValueError, match="provenance"):
        summary_lib.check(broken)
    table = summary_lib.contrast_table(result)
    assert "| arm1 - base | pass@1 | 3 (seed) |" in table
    readme = f"# t\n\nprose\n\n{summary_lib.MARK_BEGIN}\nstale text\n{summary_lib.MARK_END}\n\nmore\n"
    new = summary_lib.replace_marked(readme, table)
    assert "stale text" not in new and table.strip() in new and new.endswith("more\n")
    appended = summary_lib.replace_marked("# t\n", "x")
    assert summary_lib.MARK_BEGIN in appended and "x" in appended


def _contrast(diff, lo, hi, p_holm, per_base=(), metric="pass@1"):
    return {"a": "x", "b": "y", "metric": metric, "n": 6, "diff": diff, "ci95": [lo, hi],
            "p": p_holm / 2, "p_holm": p_holm,
            "per_base": {f"b{i}": {"diff": d} for i, d in enumerate(per_base)}}


def test_verdicts_follow_from_the_contrast_by_one_rule():
    up = summary_lib.Claim("x beats y", "src", ("x", "y", "pass@1"), ">", margin=0.02)
    down = summary_lib.Claim("x is below y", "src", ("x", "y", "pass@1"), "<", margin=0.02)
    same = summary_lib.Claim("x equals y", "src", ("x", "y", "pass@1"), "=", margin=0.02)
    verdict = summary_lib.verdict_of
    v, why = verdict(up, _contrast(0.05, 0.03, 0.07, 0.01, (0.04, 0.06)))
    assert v == "reproduced" and "reaches the margin +2.0" in why and "clears it" in why
    # the point estimate reaches the margin, the interval's near end does not: reproduced,
    # and it says so
    v, why = verdict(up, _contrast(0.03, 0.01, 0.05, 0.01, (0.025, 0.035)))
    assert v == "reproduced" and "does not clear it" in why
    # significant and the right sign, but short of the margin: its own verdict
    v, why = verdict(up, _contrast(0.015, 0.01, 0.02, 0.001, (0.014, 0.016)))
    assert v == "below the margin" and "falls short of the margin +2.0" in why
    # significant, but one base goes the other way: not resolved, and it says so
    v, why = verdict(up, _contrast(0.05, 0.03, 0.07, 0.01, (0.015, -0.001)))
    assert v == "not resolved" and "1 of 2 bases" in why
    # two bases that disagree (effects more than the margin apart, one past it and one short
    # of it): no verdict on two bases ...
    v, why = verdict(up, _contrast(0.05, 0.03, 0.07, 0.01, (0.08, 0.015)))
    assert v == "not resolved" and "at least 4 bases (has 2)" in why
    # ... and one on four
    assert verdict(up, _contrast(0.05, 0.03, 0.07, 0.01, (0.08, 0.015, 0.05, 0.05)))[0] \
        == "reproduced"
    # bases that differ by more than the margin but agree (both past it) are not a dispute
    assert verdict(up, _contrast(0.08, 0.06, 0.10, 0.01, (0.05, 0.11)))[0] == "reproduced"
    v, why = verdict(same, _contrast(0.0, -0.01, 0.01, 0.9, (0.015, -0.01)))
    assert v == "reproduced"
    v, why = verdict(same, _contrast(0.0, -0.01, 0.01, 0.9, (0.025, -0.01)))
    assert v == "not resolved" and "disagree" in why
    assert verdict(up, _contrast(-0.05, -0.07, -0.03, 0.01))[0] == "not reproduced"
    assert verdict(down, _contrast(-0.05, -0.07, -0.03, 0.01))[0] == "reproduced"
    # a raw p below 0.05 is not enough once Holm's adjustment lifts it
    assert verdict(up, _contrast(0.05, 0.01, 0.09, 0.2))[0] == "not resolved"
    # an interval that stops short of the margin refutes a directional claim; inside the
    # margin it shows an equality
    assert verdict(up, _contrast(0.005, -0.01, 0.015, 0.6))[0] == "not reproduced"
    assert verdict(up, _contrast(-0.02, -0.06, 0.015, 0.3))[0] == "not reproduced"
    assert verdict(down, _contrast(0.02, -0.015, 0.06, 0.3))[0] == "not reproduced"
    assert verdict(same, _contrast(0.005, -0.01, 0.015, 0.6))[0] == "reproduced"
    assert verdict(same, _contrast(0.005, -0.01, 0.03, 0.6))[0] == "not resolved"
    v, why = verdict(same, _contrast(0.05, 0.03, 0.07, 0.01))
    assert v == "not reproduced" and "+5.0, beyond ±2.0" in why
    # significant, but the difference lies inside the margin: a difference that may not
    # matter refutes no "comparable", and the interval does not show one either
    v, why = verdict(same, _contrast(0.015, 0.005, 0.025, 0.01))
    assert v == "not resolved" and "+1.5 lies inside ±2.0" in why
    assert verdict(same, _contrast(-0.025, -0.035, -0.015, 0.01))[0] == "not reproduced"
    assert verdict(up, _contrast(math.nan, math.nan, math.nan, math.nan))[0] == "not resolved"
    # a ceiling: the base leaves less than the margin to gain, whatever the data say
    v, why = verdict(up, _contrast(0.05, 0.03, 0.07, 0.01), headroom=0.015)
    assert v == "not testable here" and "the base leaves room for at most 1.5" in why
    # the room named by the arm and metric it is computed from (here not the base's)
    floor = summary_lib.Claim("x below y", "src", ("x", "y", "pass@1"), "<", margin=0.02,
                              headroom=("y", "pass@1", 0.0))
    v, why = verdict(floor, _contrast(-0.05, -0.07, -0.03, 0.01), headroom=0.01)
    assert v == "not testable here" and why.startswith(
        "a ceiling: y's pass@1 leaves room for at most 1.0, below the margin 2.0")
    assert verdict(up, _contrast(0.05, 0.03, 0.07, 0.01), headroom=0.03)[0] == "reproduced"
    # "bounded by": x not above y by the margin (+2 points) or more, and its mirror
    atmost = summary_lib.Claim("x bounded by y", "src", ("x", "y", "pass@1"), "<=", margin=0.02)
    atleast = summary_lib.Claim("x keeps y", "src", ("x", "y", "pass@1"), ">=", margin=0.02)
    v, why = verdict(atmost, _contrast(-0.05, -0.07, 0.015, 0.2))
    assert v == "reproduced" and "below +2.0" in why
    assert verdict(atmost, _contrast(-0.05, -0.07, -0.03, 0.01))[0] == "reproduced"
    assert verdict(atmost, _contrast(0.02, 0.01, 0.03, 0.01))[0] == "not resolved"
    v, why = verdict(atmost, _contrast(0.05, 0.03, 0.07, 0.01))
    assert v == "not reproduced" and "above +2.0" in why
    assert verdict(atleast, _contrast(0.05, -0.015, 0.07, 0.2))[0] == "reproduced"
    v, why = verdict(atleast, _contrast(-0.05, -0.07, -0.03, 0.01))
    assert v == "not reproduced" and "below -2.0" in why
    assert verdict(atleast, _contrast(-0.02, -0.03, -0.01, 0.01))[0] == "not resolved"
    with pytest.raises(ValueError, match="margin"):
        summary_lib.Claim("x", "src", ("x", "y", "m"), "<=")
    with pytest.raises(ValueError, match="margin"):
        summary_lib.Claim("x", "src", ("x", "y", "m"), ">")
    untestable = summary_lib.Claim("at scale", "src", None, untestable="needs a 7B model")
    assert verdict(untestable, None) == ("not testable here", "needs a 7B model")
    with pytest.raises(ValueError, match="expect"):
        summary_lib.Claim("x", "src", ("x", "y", "m"), "≥", margin=1)
    with pytest.raises(ValueError, match="untestable"):
        summary_lib.Claim("x", "src", None)
    with pytest.raises(ValueError, match="can_fail"):
        summary_lib.Claim("x", "src", ("x", "y", "m"), ">", margin=1, kind="check")
    assert "by at least +2.0" not in up.failure() and "by at least 2.0" in up.failure()
    # `why`: the design's reason first, then the rule's statement; not with a can_fail of
    # its own, on a check or on an untestable claim
    reasoned = summary_lib.Claim("x", "src", ("x", "y", "m"), ">", margin=1,
                                 why="the base sits near the ceiling")
    assert reasoned.failure() == (
        "the base sits near the ceiling; fails unless x lies above y in m by at least 1.0000 "
        "(point estimate), Holm p < 0.05 that way, and no base goes the other way")
    for fields in ({"can_fail": "its own"}, {"kind": "check", "can_fail": "no: built in"}):
        with pytest.raises(ValueError, match="`why` goes with the rule's statement"):
            summary_lib.Claim("x", "src", ("x", "y", "m"), ">", margin=1, why="w", **fields)
    with pytest.raises(ValueError, match="`why`"):
        summary_lib.Claim("x", "src", None, untestable="needs a 7B model", why="w")


def test_summary_verdicts_from_the_arms():
    arms = {"x": {"seeds": [0, 1, 2], "bases": ["b"] * 3,
                  "metrics": {"pass@1": [0.50, 0.52, 0.55]}},
            "y": {"seeds": [0, 1, 2], "bases": ["b"] * 3,
                  "metrics": {"pass@1": [0.30, 0.31, 0.33]}}}
    claim = summary_lib.Claim("RL raises pass@1", "src", ("x", "y", "pass@1"), ">",
                              margin=0.05)
    check = summary_lib.Claim("a penalty lowers what it penalises", "src",
                              ("x", "y", "pass@1"), ">", margin=0.05, kind="check",
                              can_fail="no: by construction")
    ceiling = summary_lib.Claim("x above y", "src", ("x", "y", "pass@1"), ">", margin=0.05,
                                headroom=("y", "pass@1", 0.35))
    protocol = {"eval_seed": 1, "problems": 8, "samples_per_problem": 2,
                "problems_fixed_across_seeds": True}
    provenance = dict.fromkeys(summary_lib.PROVENANCE)
    built = summary_lib.build(study="t", tier="mini", provenance=provenance, protocol=protocol,
                              arms=arms, specs=[("x", "y", "pass@1")],
                              claims=[claim, check, ceiling])
    assert [v["verdict"] for v in built["verdicts"]] == [
        "reproduced", "reproduced", "not testable here"]
    assert [v["kind"] for v in built["verdicts"]] == ["claim", "check", "claim"]
    assert built["verdicts"][1]["can_fail"] == "no: by construction"
    assert "by at least 5.0" in built["verdicts"][0]["can_fail"]
    # the ceiling from the base arm: 0.35 - mean(0.30, 0.31, 0.33) = 0.03 < the margin
    assert built["verdicts"][2]["headroom"] == pytest.approx(0.35 - 0.94 / 3)
    assert "+21.0" in built["verdicts"][0]["result"]
    table = summary_lib.verdict_table(built)
    assert "**reproduced**" in table and table.index("Checks") < table.index("by construction")
    # the tally counts the claim that could have failed, the check apart, the untestable not
    tally = summary_lib.tally(built)
    assert tally["reproduced"] == 1 and tally["checks"] == 1 and sum(tally.values()) == 2
    # a claim whose arms have not run is "not run", and not counted either
    assert summary_lib.verdict_of(claim, None)[0] == "not run"
    assert sum(summary_lib.tally({"verdicts": [{"kind": "claim", "verdict": "not run"}]})
               .values()) == 0
    broken = {**built, "verdicts": [dict(built["verdicts"][0], kind="maybe")]}
    with pytest.raises(ValueError, match="kind"):
        summary_lib.check(broken)
    with pytest.raises(ValueError, match="not one of the study's contrasts"):
        summary_lib.build(study="t", tier="mini", provenance=provenance, protocol=protocol,
                          arms=arms, specs=[("x", "y", "pass@8")], claims=[claim])


def test_verdict_texts_show_figures_at_the_studys_display_scale():
    """A metric the study shows in points (`scales`) gets its difference, interval, margin and
    the rule's statement in points in the verdict too, as in its tables; without a scale a
    metric not named as a rate shows four digits."""
    arms = {"x": {"seeds": [0, 1, 2], "bases": ["b"] * 3,
                  "metrics": {"gap": [0.50, 0.52, 0.55]}},
            "y": {"seeds": [0, 1, 2], "bases": ["b"] * 3,
                  "metrics": {"gap": [0.30, 0.31, 0.33]}}}
    claim = summary_lib.Claim("x above y", "src", ("x", "y", "gap"), ">", margin=0.05)

    def built(scales):
        return summary_lib.build(
            study="t", tier="mini", provenance=dict.fromkeys(summary_lib.PROVENANCE),
            protocol={"eval_seed": 1, "problems": 8, "samples_per_problem": 2,
                      "problems_fixed_across_seeds": True},
            arms=arms, specs=[("x", "y", "gap")], claims=[claim], scales=scales)["verdicts"][0]

    points, plain = built({"gap": (100.0, 1)}), built(None)
    assert "gap: +21.0 [" in points["result"] and "gap: +0.2100 [" in plain["result"]
    assert "by at least 5.0 (point estimate)" in points["can_fail"]
    assert "by at least 0.0500 (point estimate)" in plain["can_fail"]
    assert "reaches the margin +5.0" in points["why"]
    assert "reaches the margin +0.0500" in plain["why"]
    assert points["verdict"] == plain["verdict"] == "reproduced"


def test_a_two_sided_claim_is_a_directional_one_in_the_direction_the_difference_took():
    """expect "!=": reproduced when Holm p < 0.05 and the difference reaches the margin
    either way with no base against it; below the margin when it falls short; not
    reproduced when the interval lies inside ±margin; not resolved when the interval is
    wide, or one base goes the other way (hand-made contrasts, margin 2 points)."""
    differs = summary_lib.Claim("x differs from y", "src", ("x", "y", "pass@1"), "!=",
                                margin=0.02)
    verdict = summary_lib.verdict_of
    for sign in (1, -1):
        v, why = verdict(differs, _contrast(0.05 * sign, 0.03 * sign, 0.07 * sign, 0.01,
                                            (0.04 * sign, 0.06 * sign)))
        assert v == "reproduced" and ("+2.0" if sign > 0 else "-2.0") in why
        assert verdict(differs, _contrast(0.015 * sign, 0.01 * sign, 0.02 * sign, 0.001,
                                          (0.014 * sign, 0.016 * sign)))[0] == "below the margin"
        v, why = verdict(differs, _contrast(0.05 * sign, 0.03 * sign, 0.07 * sign, 0.01,
                                            (0.015 * sign, -0.001 * sign)))
        assert v == "not resolved" and "1 of 2 bases go the other way" in why
    v, why = verdict(differs, _contrast(0.001, -0.01, 0.012, 0.8))
    assert v == "not reproduced" and "inside ±2.0" in why
    # not significant, the interval short of +2 on its own side but past -2 on the other:
    # a difference that matters is still possible, so no verdict
    assert verdict(differs, _contrast(0.005, -0.03, 0.015, 0.6))[0] == "not resolved"
    assert "lies at least 2.0 from zero either way" in differs.failure()
