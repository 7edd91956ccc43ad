"""Sample-based evaluation metrics: pass@k, maj@k, format rate, length, by difficulty."""

from __future__ import annotations

import fractions
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SOLVED_AT", "evaluate_samples", "maj_at_k", "majority_vote", "pass_at_k", "solved"]

# A completion counts as solved (pass@1; a correct sample of pass@k and maj@k) when its
# accuracy reward reaches this.
SOLVED_AT = 1.0


def solved(accuracy):
    """pass@1's rule: the accuracy reward (a float, or a numpy / jax array of them) >= 1.

    The RL rollouts' solved rows (`Rollout.correct`: the accuracy component, or the total
    reward of a task without one), the evaluation's correct samples and the advantage
    estimators' verified-correct indicator all use it.
    """
    return accuracy >= SOLVED_AT


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct.

    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i), computed as
    the product (no large binomials). Chen et al. (2021), https://arxiv.org/abs/2107.03374.

    Args:
      n: samples drawn for the problem (>= 1).
      c: correct samples (0 <= c <= n).
      k: budget (1 <= k <= n).

    Returns:
      the probability that at least one of k samples drawn without replacement from the n
      is correct (float in [0, 1]).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """The most frequent non-None answer; ties go to the answer that appears first.

    Args:
      answers: extracted answers, None where none could be extracted.

    Returns:
      (winning answer or None if no answer votes, its index of first appearance or -1).
    """
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, index)
    if not counts:
        return None, -1
    winner = min(counts, key=lambda a: (-counts[a], first[a]))
    return winner, first[winner]


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Unbiased maj@k (cons@k): the chance that a majority vote over k of the n samples,
    drawn without replacement, picks a correct answer.

    The exact mean over all C(n, k) subsets of k samples, computed from the answers' vote
    counts (no enumeration of subsets): like pass@k, an unbiased estimate of the majority
    vote's accuracy over k fresh samples. In each subset None answers do not vote, a subset
    without votes scores 0, and a tie between answers with the most votes is broken
    uniformly at random (it scores the fraction of tied answers that are correct). An answer
    is correct when its first sample is (a task grades an answer, so its samples agree).
    With k = n it is the majority vote over all n samples, ties split evenly.

    Computation: for each correct answer a and each count j >= 1 of its samples in the
    subset, a dynamic program over the other answers counts the subsets in which every
    other answer has at most j votes, by how many of them tie with a at j, in exact integer
    arithmetic (milliseconds for n = 64 samples).

    Args:
      answers: extracted answers of the n samples [n], None where none was extracted.
      correct: correctness of each sample [n].
      k: samples voting (1 <= k <= n).

    Returns:
      maj@k in [0, 1].
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"maj_at_k: answers and correct differ in length ({len(answers)} vs {len(correct)})"
        )
    n = len(answers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"maj_at_k: need an int 1 <= k <= n={n}, got k={k!r}")
    votes: dict[str, int] = {}
    graded: dict[str, bool] = {}
    for answer, ok in zip(answers, correct):
        if answer is not None:
            votes[answer] = votes.get(answer, 0) + 1
            graded.setdefault(answer, bool(ok))
    silent = n - sum(votes.values())  # samples without an answer
    by_ties: dict[int, int] = {}  # t -> subsets (weighted) where a correct answer ties with t
    for answer, count in votes.items():
        if not graded[answer]:
            continue
        others = [m for other, m in votes.items() if other != answer]
        for j in range(1, min(count, k) + 1):
            rest = k - j
            ways = {(0, 0): 1}  # (samples of other answers, answers tied at j) -> subsets
            for m in others:
                grown: dict[tuple[int, int], int] = {}
                for (s, t), w in ways.items():
                    for x in range(min(m, j, rest - s) + 1):
                        key = (s + x, t + (x == j))
                        grown[key] = grown.get(key, 0) + w * math.comb(m, x)
                ways = grown
            for (s, t), w in ways.items():
                if rest - s <= silent:
                    by_ties[t] = (by_ties.get(t, 0)
                                  + math.comb(count, j) * w * math.comb(silent, rest - s))
    total = sum(fractions.Fraction(w, t + 1) for t, w in by_ties.items())
    return float(total / math.comb(n, k))


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_answer(value) -> bool:
    return value is None or isinstance(value, str)


_SAMPLE_FIELDS = {
    "answer": (_is_answer, "str or None"),
    "correct": (_is_bool, "bool"),
    "formatted": (_is_bool, "bool"),
    "length": (_is_int, "int"),
}


def _check_problem(index: int, problem: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    samples = problem.get("samples")
    if not isinstance(samples, Sequence) or isinstance(samples, str) or not samples:
        raise ValueError(f"problem {index}: 'samples' must be a non-empty list of sample dicts")
    for j, sample in enumerate(samples):
        for field, (is_valid, expected) in _SAMPLE_FIELDS.items():
            if field not in sample:
                raise ValueError(f"problem {index} sample {j}: missing field {field!r}")
            if not is_valid(sample[field]):
                raise ValueError(
                    f"problem {index} sample {j}: field {field!r} must be {expected}, "
                    f"got {type(sample[field]).__name__}"
                )
    return samples


def _per_problem(samples: Sequence[Mapping[str, Any]], ks, maj_ks) -> dict[str, float]:
    """One problem's pass@k and maj@k (computed once, averaged for every grouping)."""
    correct = [bool(x["correct"]) for x in samples]
    values = {f"pass@{k}": pass_at_k(len(samples), sum(correct), k) for k in ks}
    answers = [x["answer"] for x in samples]
    values.update({f"maj@{k}": maj_at_k(answers, correct, k) for k in maj_ks})
    return values


def _summarise(problems: Sequence[Sequence[Mapping[str, Any]]], values, ks,
               maj_ks) -> dict[str, Any]:
    num_samples = sum(len(s) for s in problems)
    per_problem = {len(s) for s in problems}
    metrics: dict[str, Any] = {
        "num_problems": len(problems),
        # samples per problem (their mean where problems have different counts)
        "num_samples": (per_problem.pop() if len(per_problem) == 1
                        else num_samples / len(problems)),
        "num_completions": num_samples}
    for name in [f"pass@{k}" for k in ks] + [f"maj@{k}" for k in maj_ks]:
        metrics[name] = sum(v[name] for v in values) / len(problems)
    metrics["format_rate"] = sum(bool(x["formatted"]) for s in problems for x in s) / num_samples
    metrics["mean_length"] = sum(int(x["length"]) for s in problems for x in s) / num_samples
    return metrics


def _default_ks(n: int) -> list[int]:
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def evaluate_samples(
    problems: Sequence[Mapping[str, Any]],
    *,
    ks: Sequence[int] | None = None,
    maj_ks: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Aggregates per-problem samples into pass@k, maj@k, format rate and mean length.

    pass@k / maj@k are per-problem values averaged over problems; format_rate and
    mean_length are averaged over all samples. The same figures are computed for each
    difficulty level under "by_difficulty".

    Args:
      problems: one mapping per problem with "samples" (list of dicts with "answer"
        str | None, "correct" bool, "formatted" bool, "length" int tokens) and optional
        "difficulty" (int, default 0).
      ks: pass@k budgets; default 1, 2, 4, ... and n, where n is the fewest samples of
        any problem.
      maj_ks: maj@k budgets; default the ks above 1 (maj@1 is pass@1 whenever every
        correct sample has an answer).

    Returns:
      {"num_problems", "num_samples" (per problem), "num_completions" (in all), "pass@k"...,
       "maj@k"..., "format_rate",
       "mean_length", "by_difficulty": {difficulty: same keys}}.
    """
    if not problems:
        raise ValueError("problems: expected at least one problem, got none")
    checked = [_check_problem(i, p) for i, p in enumerate(problems)]
    min_n = min(len(s) for s in checked)
    ks = list(ks) if ks is not None else _default_ks(min_n)
    maj_ks = list(maj_ks) if maj_ks is not None else [k for k in ks if k > 1]
    for name, budget in (("ks", ks), ("maj_ks", maj_ks)):
        for k in budget:
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min_n:
                raise ValueError(
                    f"{name}: each k must be an int in [1, {min_n}] (the fewest samples of "
                    f"any problem), got {k!r}"
                )
    values = [_per_problem(samples, ks, maj_ks) for samples in checked]
    metrics = _summarise(checked, values, ks, maj_ks)
    groups: dict[Any, tuple[list, list]] = {}
    for problem, samples, value in zip(problems, checked, values):
        group = groups.setdefault(problem.get("difficulty", 0), ([], []))
        group[0].append(samples)
        group[1].append(value)
    metrics["by_difficulty"] = {
        d: _summarise(*groups[d], ks, maj_ks)
        for d in sorted(groups, key=lambda d: (str(type(d)), d))
    }
    return metrics
