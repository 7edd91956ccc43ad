"""The statistics of sweeps and studies: t intervals, paired t tests, Holm's adjustment, bases
as blocks. One implementation: a sweep's summary and a study's tables and contrasts all use
these functions.

Pure Python (math only), so an analysis needs neither scipy nor jax; `tests/test_stats.py`
checks every function against hand-computed values and, where installed, scipy.

- `t_cdf(t, df)`, `t_sf(t, df)`, `t_quantile(q, df)`: Student's t distribution, exact
  (regularised incomplete beta function by its continued fraction), for any real df > 0.
- `interval(values)`: mean, std (n - 1), n and the 95% t interval of the mean (n - 1 degrees
  of freedom), missing or non-finite values left out: a sweep's summary figure, a study's
  table cell. `paired_interval(values, baseline)`: `interval` of the per-seed differences.
- `mean_interval(values)`: `interval` and the two-sided p of the one-sample t test of
  "mean = 0"; `paired(a, b)`: that of the per-pair differences a[i] - b[i] (pairs with a
  missing or non-finite side left out), the mean as `diff`.
- `f_sf(f, df1, df2)`: Snedecor's F distribution's upper tail, exact.
- `interaction(pairs_by_base)`: the base x arm interaction of arms paired by seed within bases,
  the one-way analysis of variance of the paired differences between bases (F, its degrees of
  freedom and p): whether the effect differs between bases by more than the seeds explain.
- `holm(ps)`: Holm's step-down adjustment over one family of p-values (Holm 1979), which
  controls the family-wise error rate at any dependence between the tests.
- `nested(pairs_by_base)`: arms' seeds nested in pretrained bases, the base a block (a fixed
  effect). Each base gets its own paired verdict; the pooled difference is the mean of the
  bases' mean differences, its interval from the spread of the seeds around their own base's
  mean (N - B degrees of freedom for N pairs on B bases), so a base that shifts both arms
  alike costs nothing and the inference is about these bases. `across_bases` gives the other
  reading (each base's mean difference one observation, B - 1 degrees of freedom: what a new
  base would show), and `between_base_sd` the spread between bases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["f_sf", "holm", "interaction", "interval", "mean_interval", "nested", "paired", "paired_interval", "t_cdf",
           "t_quantile", "t_sf"]

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    if not df > 0 or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def f_sf(f: float, df1: float, df2: float) -> float:
    """P(F > f) for Snedecor's F with (df1, df2) degrees of freedom."""
    if not (df1 > 0 and df2 > 0) or math.isnan(f):
        return math.nan
    if f <= 0.0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return _betainc(df2 / 2.0, df1 / 2.0, df2 / (df2 + df1 * f))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    return 1.0 - t_sf(t, df)


def t_quantile(q: float, df: float) -> float:
    """The q quantile of Student's t with df degrees of freedom (0 < q < 1)."""
    if not 0.0 < q < 1.0 or not df > 0:
        return math.nan
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        high *= 2.0
        if high > 1e12:
            return math.inf
    for _ in range(200):  # bisection to machine precision
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
        if high - low <= 1e-14 * max(1.0, high):
            break
    return 0.5 * (low + high)


def _finite(value) -> bool:
    return value is not None and not isinstance(value, bool) and math.isfinite(float(value))


def _differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] - b[i] over the pairs (zip) whose sides are both present and finite."""
    return [float(x) - float(y) for x, y in zip(a, b) if _finite(x) and _finite(y)]


def interval(values: Sequence[float]) -> dict:
    """mean, std (n - 1), n and the 95% t interval of the mean (n - 1 degrees of freedom);
    missing or non-finite values are left out. With n < 2 std and the interval are NaN (no
    spread to measure), with n = 0 the mean too."""
    values = [float(v) for v in values if _finite(v)]
    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return {"mean": mean, "std": math.nan, "n": n, "ci95": [math.nan, math.nan]}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.975, n - 1) * (std / math.sqrt(n))
    return {"mean": mean, "std": std, "n": n, "ci95": [mean - half, mean + half]}


def paired_interval(values: Sequence[float], baseline: Sequence[float]) -> dict:
    """`interval` of the per-seed differences values[i] - baseline[i]: arms paired by seed
    (same seed, same eval problems) cancel what the seed shares, so the interval is of the
    effect, not of two spreads. Pairs with a missing or non-finite side are left out, as are
    the values past the shorter list."""
    return interval(_differences(values, baseline))


def mean_interval(values: Sequence[float]) -> dict:
    """`interval` (keys n, mean, std, ci95) and the two-sided p of "mean = 0" (one-sample t
    test). With n < 2 p is NaN; with zero spread and a nonzero mean p is 0, with zero spread
    and a zero mean p is 1."""
    out = interval(values)
    n, mean, std = out["n"], out["mean"], out["std"]
    if n < 2:
        p = math.nan
    else:
        se = std / math.sqrt(n)
        if se == 0.0:
            p = 1.0 if mean == 0.0 else 0.0
        else:
            p = min(1.0, 2.0 * t_sf(abs(mean) / se, n - 1))
    return {"n": n, "mean": mean, "std": std, "ci95": out["ci95"], "p": p}


def paired(a: Sequence[float], b: Sequence[float]) -> dict:
    """The paired t interval and test of a - b over pairs (a[i], b[i]): `mean_interval` of the
    differences, with the mean as `diff`. Pairs with a missing or non-finite side are left
    out; lists of different lengths are refused."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values against {len(b)}")
    out = mean_interval(_differences(a, b))
    out["diff"] = out.pop("mean")
    return out


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort the m p-values
    ascending, multiply the i-th smallest (i from 0) by m - i, take the running maximum and
    cap at 1. A NaN p (a contrast without a spread) stays NaN and does not count in m."""
    indexed = sorted((p, i) for i, p in enumerate(ps) if _finite(p))
    m = len(indexed)
    adjusted = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * float(p)))
        adjusted[i] = running
    return adjusted


def interaction(pairs_by_base: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> dict:
    """The base x arm interaction: {base: (a values, b values) paired by seed}.

    F = [sum_b n_b (mean_b - mean)^2 / (B - 1)] / [sum_b sum_i (d_bi - mean_b)^2 / (N - B)]
    over the paired differences d (mean: the mean of all N differences), with (B - 1, N - B)
    degrees of freedom: the between-bases variance of the effect against its within-base
    variance. Returns {"F", "df1", "df2", "p"}; with one base or no within-base spread F and p
    are NaN (p is 0 when the bases differ and no seed varies)."""
    groups = [d for d in (_differences(a, b) for a, b in pairs_by_base.values()) if d]
    n, blocks = sum(len(d) for d in groups), len(groups)
    df1, df2 = blocks - 1, n - blocks
    if df1 < 1 or df2 < 1:
        return {"F": math.nan, "df1": df1, "df2": df2, "p": math.nan}
    grand = sum(sum(d) for d in groups) / n
    between = sum(len(d) * (sum(d) / len(d) - grand) ** 2 for d in groups) / df1
    within = sum(sum((x - sum(d) / len(d)) ** 2 for x in d) for d in groups) / df2
    if within == 0.0:
        p = math.nan if between == 0.0 else 0.0
        return {"F": math.inf if between else math.nan, "df1": df1, "df2": df2, "p": p}
    f = between / within
    return {"F": f, "df1": df1, "df2": df2, "p": f_sf(f, df1, df2)}


def nested(pairs_by_base: Mapping[str, tuple[Sequence[float], Sequence[float]]]) -> dict:
    """Arms' seeds nested in bases: {base: (a values, b values) paired by seed}.

    Returns the pooled verdict with the base as a block (keys n, diff, std, ci95, p, df;
    `std` is the pooled within-base standard deviation of the differences), `unit` "seed"
    (one base) or "seed in base" (two or more), `per_base` {base: `paired` of that base's
    seeds}, `across_bases` (`mean_interval` of the bases' mean differences: n = B) and
    `between_base_sd` (NaN with one base), `interaction` (see there). With one base this is
    `paired` (and the interaction's F and p are NaN)."""
    per_base = {str(base): paired(list(a), list(b)) for base, (a, b) in pairs_by_base.items()}
    usable = {base: v for base, v in per_base.items() if v["n"] > 0}
    across = mean_interval([v["diff"] for v in usable.values()])
    if len(usable) <= 1:
        a_all = [x for a, _ in pairs_by_base.values() for x in a]
        b_all = [y for _, b in pairs_by_base.values() for y in b]
        pooled = paired(a_all, b_all)
        pooled.update(unit="seed", df=pooled["n"] - 1)
    else:
        residual, n = 0.0, 0
        for base, (a, b) in pairs_by_base.items():
            if str(base) not in usable:
                continue
            diffs = _differences(a, b)
            mean = sum(diffs) / len(diffs)
            residual += sum((d - mean) ** 2 for d in diffs)
            n += len(diffs)
        blocks = len(usable)
        df = n - blocks
        diff = sum(v["diff"] for v in usable.values()) / blocks
        if df < 1:
            std = se = half = p = math.nan
        else:
            std = math.sqrt(residual / df)
            se = std * math.sqrt(sum(1.0 / v["n"] for v in usable.values())) / blocks
            half = t_quantile(0.975, df) * se
            if se == 0.0:
                p = 1.0 if diff == 0.0 else 0.0
            else:
                p = min(1.0, 2.0 * t_sf(abs(diff) / se, df))
        pooled = {"n": n, "diff": diff, "std": std, "ci95": [diff - half, diff + half],
                  "p": p, "unit": "seed in base", "df": df}
    pooled["per_base"] = per_base
    pooled["across_bases"] = across
    pooled["interaction"] = interaction(pairs_by_base)
    pooled["between_base_sd"] = across["std"] if len(usable) > 1 else math.nan
    return pooled
