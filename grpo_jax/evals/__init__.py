"""Evaluation: unbiased pass@k, maj@k, format rate, lengths, by-difficulty reports."""

from grpo_jax.evals.metrics import (SOLVED_AT, evaluate_samples, maj_at_k, majority_vote,
                                    pass_at_k, solved)
from grpo_jax.evals.report import flatten_metrics, format_value, series_points, write_report

__all__ = [
    "SOLVED_AT",
    "evaluate_samples",
    "flatten_metrics",
    "format_value",
    "maj_at_k",
    "majority_vote",
    "pass_at_k",
    "series_points",
    "solved",
    "write_report",
]
