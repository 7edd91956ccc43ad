"""A study's presentation: table cells (mean ± the 95% t half-width, paired differences)
and plots (bands of mean ± 1 std over seeds, curve panels, bar plots) on matplotlib's Agg
backend."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from grpo_jax import sweep
from grpo_jax.stats import interval


def cell(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """Mean ± the half-width of the 95% t interval over seeds, as a table cell."""
    return sweep.format_interval(interval([v for v in values if v is not None]),
                                 scale, digits)


def paired_cell(stats: dict, scale: float = 100.0, digits: int = 1) -> str:
    """A paired difference (a contrast's diff, ci95, n) as "+d [lo, hi]" (scaled), "+d (n=1)"
    without an interval, "-" without pairs."""
    if not stats.get("n") or not math.isfinite(stats["diff"]):
        return "-"
    lo, hi = stats["ci95"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{stats['diff'] * scale:+.{digits}f} (n={stats['n']})"
    return (f"{stats['diff'] * scale:+.{digits}f} [{lo * scale:+.{digits}f}, "
            f"{hi * scale:+.{digits}f}]")


def error_bars(stats: Sequence[Mapping], scale: float = 1.0, *, key: str = "mean"
               ) -> tuple[list[float], list[float]]:
    """Error-bar data of intervals (`grpo_jax.stats.interval`'s, or paired ones with
    key="diff"): each `key` and the half-width of its 95% interval, times `scale`; a
    half-width of 0.0 where there is no interval (n < 2)."""
    means = [s[key] * scale for s in stats]
    halves = [(s["ci95"][1] - s["ci95"][0]) / 2 * scale if s["n"] > 1 else 0.0 for s in stats]
    return means, halves


def interval_line(ax, x: Sequence[float], stats: Sequence[Mapping], *, color: str,
                  label: str | None, style: str = "-", scale: float = 100.0) -> None:
    """A curve of intervals (`grpo_jax.stats.interval`'s or `paired_interval`'s, one per x):
    their means times `scale`, and the band of their 95% intervals where every point has
    one (n > 1)."""
    import numpy as np

    ax.plot(x, np.array([s["mean"] for s in stats]) * scale, style, marker="o", ms=3,
            color=color, label=label)
    if all(s["n"] > 1 for s in stats):
        ax.fill_between(x, np.array([s["ci95"][0] for s in stats]) * scale,
                        np.array([s["ci95"][1] for s in stats]) * scale, color=color,
                        alpha=0.15)


def k_axis(ax, ks: Sequence[int]) -> None:
    """`ax`'s x axis as samples per problem: log2, a tick at each k of `ks`."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks], fontsize=7)
    ax.set_xlabel("k (samples per problem)")


def band(ax, series: Sequence[Sequence[float]], *, label: str, color: str,
         x: Sequence[float] | None = None) -> None:
    """One arm's curve on `ax`: the mean over seeds with a band of ±1 standard deviation
    (series cut to the shortest)."""
    import numpy as np

    series = [s for s in series if len(s)]
    if not series:
        return
    length = min(len(s) for s in series)
    values = np.asarray([list(s)[:length] for s in series], float)
    if np.isnan(values).all():
        return
    steps = np.arange(1, length + 1) if x is None else np.asarray(x)[:length]
    mean = np.nanmean(values, axis=0)
    ax.plot(steps, mean, label=label, color=color)
    if len(values) > 1:
        std = np.nanstd(values, axis=0, ddof=1)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.15, color=color)


def curve_panels(curves: Mapping[str, Sequence[Sequence[dict]]],
                 panels: Sequence[tuple[str, str]], out: str, name: str = "curves.png"
                 ) -> None:
    """`out/name`: one panel per (metric, title) of the training rows over the GRPO steps,
    one band per arm (`curves`: {arm: each finished run's training rows}), mean ± 1 std."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.2), squeeze=False)
    for index, (arm, series) in enumerate(curves.items()):
        for ax, (metric, _) in zip(axes[0], panels):
            band(ax, [[r.get(metric, np.nan) for r in rows] for rows in series], label=arm,
                 color=f"C{index}")
    for ax, (_, title) in zip(axes[0], panels):
        ax.set_xlabel("GRPO step")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, out, name)


def bar_plot(arms: Mapping[str, dict], metrics: Sequence[tuple[str, str, float]], out: str,
             name: str = "arms.png") -> None:
    """`out/name`: one panel per (metric, title, scale) with each arm's mean over its runs
    and the 95% t interval as an error bar."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.4), squeeze=False)
    for ax, (metric, title, scale) in zip(axes[0], metrics):
        labels = [label for label, entry in arms.items() if metric in entry["metrics"]]
        means, halves = error_bars([interval([v for v in arms[label]["metrics"][metric]
                                              if v is not None]) for label in labels], scale)
        ax.bar(range(len(labels)), np.nan_to_num(means), yerr=np.nan_to_num(halves),
               capsize=4, color=[f"C{i}" for i in range(len(labels))])
        ax.set_xticks(range(len(labels)), [label.replace(" ", "\n", 1) for label in labels],
                      fontsize=7)
        ax.set_title(f"{title}, 95% interval over runs", fontsize=9)
    save_figure(fig, out, name)


def save_figure(fig, out: str, name: str) -> None:
    """Lays `fig` out, writes it to `out/name` (PNG, 120 dpi) and closes it."""
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    pyplot().close(fig)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
