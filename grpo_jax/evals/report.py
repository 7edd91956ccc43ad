"""Evaluation reports: a Markdown table, a JSON file with the same figures, PNG plots."""

from __future__ import annotations

import io
import json
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_jax import storage

__all__ = ["flatten_metrics", "format_value", "series_points", "write_report"]


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flattens nested metric dicts with "/" ("by_difficulty/3/pass@1").

    Args:
      metrics: possibly nested dict of numbers.
      prefix: key prefix.

    Returns:
      flat dict in insertion order.
    """
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, prefix=f"{name}/"))
        else:
            flat[name] = value
    return flat


def format_value(value: Any) -> str:
    """The table text of one figure: ints as is, floats with 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.4g}"
    return str(value).replace("|", "\\|")


def _json_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


def series_points(history: Sequence[Mapping[str, Any]], series: str, *,
                  step_key: str = "step", group_key: str | None = None
                  ) -> dict[Any, tuple[list, list[float]]]:
    """The finite points of `series` in `history`: {group: (steps, values)}, one group per
    value of `group_key` in order of appearance (one group, None, without it)."""
    groups: dict[Any, tuple[list, list[float]]] = {}
    for row in history:
        value = row.get(series)
        if step_key not in row or not isinstance(value, numbers.Real) \
                or isinstance(value, bool) or not math.isfinite(float(value)):
            continue
        steps, values = groups.setdefault(row.get(group_key) if group_key else None, ([], []))
        steps.append(row[step_key])
        values.append(float(value))
    return groups


def _plot_series(path: str, name: str, groups: Mapping[Any, tuple[list, list[float]]],
                 title: str, xlabel: str) -> None:
    # Figure + FigureCanvasAgg directly: no global matplotlib backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.0, 3.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, (steps, values) in groups.items():  # one line per group (stage)
        axes.plot(steps, values, marker="." if len(steps) < 50 else None,
                  label=None if label is None else str(label))
    if len(groups) > 1 or None not in groups:
        axes.legend(fontsize=7)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(name)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    _save_png(figure, path)


def _save_png(figure, path: str) -> None:
    """The figure as a PNG file at `path` (a local path or a URL)."""
    data = io.BytesIO()
    figure.savefig(data, format="png")
    storage.write_bytes(path, data.getvalue())


AT_K_FILE = "plot_at_k.png"
_AT_K = re.compile(r"^(pass|maj)@(\d+)$")


def at_k_curves(flat: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, list]]:
    """column -> {"pass" / "maj": [(k, value), ...] sorted by k} from flattened summaries
    (only the curves with at least two k)."""
    curves: dict[str, dict[str, list]] = {}
    for column, metrics in flat.items():
        for name, value in metrics.items():
            match = _AT_K.match(name)
            if match and isinstance(value, (int, float)):
                curves.setdefault(column, {}).setdefault(match.group(1), []).append(
                    (int(match.group(2)), float(value)))
    return {c: {kind: sorted(points) for kind, points in kinds.items() if len(points) > 1}
            for c, kinds in curves.items() if any(len(p) > 1 for p in kinds.values())}


def _plot_at_k(path: str, curves, labels: Mapping[str, str], title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.0, 3.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for column, kinds in curves.items():
        for kind, points in kinds.items():
            ks, values = zip(*points)
            axes.plot(ks, values, marker="o", linestyle="-" if kind == "pass" else "--",
                      label=f"{kind}@k, {labels.get(column, column)}")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("k (samples per problem)")
    axes.set_ylabel("fraction of problems")
    axes.set_title(title)
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    _save_png(figure, path)


def _file_name(series: str) -> str:
    return "plot_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", series).strip("_") + ".png"


def write_report(
    workdir: str | os.PathLike,
    *,
    title: str,
    summary: Mapping[str, Mapping[str, Any]],
    history: Sequence[Mapping[str, Any]] = (),
    plots: Sequence[str] = ("reward_mean", "pass@1"),
    draw: bool = True,
    step_key: str = "step",
    group_key: str | None = None,
    labels: Mapping[str, str] | None = None,
    notes: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Writes report.md, report.json and one PNG per plotted series into `workdir`.

    The table has one row per (flattened) metric and one column per summary entry, e.g.
    {"before": metrics, "after": metrics}, headed by its label; report.json holds the same
    figures under the summary's keys (the table rounds floats to 4 significant digits, the
    JSON keeps them whole) and the headers under "labels".

    Args:
      workdir: output directory (created): a path or a URL (`grpo_jax.storage`).
      title: report heading.
      summary: column name -> metrics dict (nested dicts are flattened with "/").
      history: per-step metric dicts (e.g. `grpo_jax.metrics.read_metrics(workdir)`),
        each with `step_key`.
      plots: series of `history` to plot against `step_key`; absent series are skipped.
      draw: False writes report.md and report.json without any PNG (neither `plots` nor
        the pass@k curves; "plots" and "plot_steps" are then empty).
      step_key: the step field of history rows (the x axis).
      group_key: a field of history rows (e.g. "stage") that splits each series into one
        labelled line per value; None draws one line.
      labels: column name -> table header (e.g. {"after": "rl"}); a column without one is
        headed by its name.
      notes: lines of text printed under the table (e.g. what the columns are).
      extra: more top-level entries of report.json (e.g. "provenance": the code's commit).

    Returns:
      {"markdown": path, "json": path, "plot:<series>": path, ...}. report.json also has
      "plot_steps": {series: {group ("all" without group_key): [first, last step]}}.
    """
    if not isinstance(summary, Mapping) or not summary:
        raise ValueError("summary: expected a non-empty dict of column name -> metrics dict")
    for column, metrics in summary.items():
        if not isinstance(metrics, Mapping):
            raise ValueError(
                f"summary[{column!r}]: expected a metrics dict, got {type(metrics).__name__}"
            )
    workdir = os.fspath(workdir)
    storage.makedirs(workdir)
    columns = [str(c) for c in summary]
    labels = {c: str((labels or {}).get(c, c)) for c in columns}
    flat = {str(c): flatten_metrics(m) for c, m in summary.items()}
    rows: list[str] = []
    for metrics in flat.values():
        rows.extend(name for name in metrics if name not in rows)

    paths: dict[str, str] = {}
    plotted: dict[str, str] = {}
    spans: dict[str, dict[str, list]] = {}  # series -> group -> [first, last] x value
    for series in plots if draw else ():
        groups = series_points(history, series, step_key=step_key, group_key=group_key)
        if not groups:
            continue
        file_name = _file_name(series)
        _plot_series(storage.join(workdir, file_name), series, groups, title, step_key)
        plotted[series] = file_name
        spans[series] = {"all" if group is None else str(group): [min(steps), max(steps)]
                         for group, (steps, _) in groups.items()}
        paths[f"plot:{series}"] = storage.join(workdir, file_name)

    curves = at_k_curves(flat) if draw else {}
    if curves:  # pass@k (unbiased) and maj@k against k, one line per eval column
        _plot_at_k(storage.join(workdir, AT_K_FILE), curves, labels, title)
        plotted["pass@k, maj@k"] = AT_K_FILE
        paths["plot:at_k"] = storage.join(workdir, AT_K_FILE)

    headers = [format_value(labels[c]) for c in columns]
    lines = [f"# {title}", "", "| metric | " + " | ".join(headers) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for name in rows:
        cells = [format_value(flat[c].get(name)) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *notes]
    if history:
        lines += ["", f"Training history: {len(history)} logged steps."]
    for series, file_name in plotted.items():
        lines += ["", f"![{series}]({file_name})"]
    markdown_path = storage.join(workdir, "report.md")
    storage.write_text(markdown_path, "\n".join(lines) + "\n")

    report = {
        "title": title,
        "columns": columns,
        "labels": labels,
        "metrics": {name: {c: _json_value(flat[c].get(name)) for c in columns} for name in rows},
        "summary": _json_value(summary),
        "num_history_steps": len(history),
        "plots": plotted,
        "plot_steps": spans,
        **(extra or {}),
    }
    json_path = storage.join(workdir, "report.json")
    storage.write_text(json_path, json.dumps(report, indent=2))
    paths["markdown"] = markdown_path
    paths["json"] = json_path
    return paths
