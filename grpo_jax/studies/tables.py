"""What most studies show of their arms: the per-arm table of table.md (a row per arm: its
name, its runs, its figures as cells of mean ± the 95% half-width over seeds; a note under
it), the plot of the arms' training curves and the bar plot of their figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from grpo_jax.studies.arms import arm_curves
from grpo_jax.studies.present import bar_plot, cell, curve_panels
from grpo_jax.studies.record import StudyRuns


def optional_cell(values: Sequence, scale: float = 100.0, digits: int = 1) -> str:
    """`cell` of the values that are not None; "-" without any."""
    values = [v for v in values if v is not None]
    return cell(values, scale, digits) if values else "-"


def optional_cells(metrics: Mapping) -> Callable[..., str]:
    """`cell(metric, scale=100.0, digits=1)`: the optional cell of one arm's metric ("-"
    where the arm has no value of it)."""
    return lambda metric, scale=100.0, digits=1: optional_cell(metrics.get(metric, []),
                                                               scale, digits)


def metric_row(*columns) -> Callable[[Mapping], list[str]]:
    """An `arm_table` row of one cell per column: a metric's name (the cell in %, one
    decimal) or (metric, scale, digits); "-" where the arm has no value of it."""
    formats = [(column,) if isinstance(column, str) else tuple(column) for column in columns]
    return lambda metrics: [optional_cell(metrics.get(name, []), *scale_digits)
                            for name, *scale_digits in formats]


def arm_table(arms: Mapping, names: Sequence[str], columns: Sequence[str],
              row: Callable[[Mapping], Sequence[str]], note: str, *,
              first: str = "policy") -> str:
    """| `first` | runs | `columns` |, then for each of `names` in `arms`: | the name | its
    seeds | row(its metrics) |; then a blank line and `note`."""
    lines = ["| " + " | ".join((first, "runs", *columns)) + " |",
             "|" + "---|" * (len(columns) + 2)]
    for name in names:
        if name in arms:
            cells = (name, str(len(arms[name]["seeds"])), *row(arms[name]["metrics"]))
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", note]
    return "\n".join(lines) + "\n"


def curve_plots(runs: StudyRuns, names: Sequence[str],
                panels: Sequence[tuple[str, str]]) -> Callable[[str], None]:
    """An `Analysis.plots`: `curve_panels` of the arms `names`' training rows (read now),
    one panel per (metric, title) of `panels`."""
    curves = arm_curves(runs, names)
    return lambda out: curve_panels(curves, panels, out)


# `bar_plots` panels of the held-out pass@k, (metric, title, scale) each.
PASS_AT_1 = ("pass@1", "held-out pass@1, %", 100.0)
PASS_AT_8 = ("pass@8", "held-out pass@8, %", 100.0)


def bar_plots(arms: Mapping, panels: Sequence[tuple[str, str, float]]
              ) -> Callable[[str], None]:
    """An `Analysis.plots`: `bar_plot` of the arms, one panel per (metric, title, scale) of
    `panels`."""
    return lambda out: bar_plot(arms, panels, out)


def rl_caption(config) -> str:
    """"the N held-out problems x S samples after K GRPO steps" of a run's config (its rl
    stage and eval_final section), so a table's caption says what ran."""
    return (f"the {config.task.eval_size} held-out problems x {config.eval_final.num_samples} "
            f"samples after {config.rl.steps} GRPO steps")
