"""Selecting verified samples for rejection-sampling SFT and distillation (DeepSeek-R1,
https://arxiv.org/abs/2501.12948, sec. 2.3.3 and 2.4)."""

from __future__ import annotations


def select_verified(records, *, min_accuracy: float = 1.0, min_format: float = 1.0,
                    dedupe: bool = True) -> list[dict]:
    """Records (as from `runner.rollouts.sample_and_score`) that are correct and well-formed.

    Keeps r with components["accuracy"] >= min_accuracy and components["format"] >=
    min_format; with `dedupe`, one copy of each (example id, text).
    """
    kept, seen = [], set()
    for r in records:
        comps = r["components"]
        if "accuracy" not in comps or "format" not in comps:
            raise ValueError("select_verified: records need 'accuracy' and 'format' components, "
                             f"got {sorted(comps)}")
        if comps["accuracy"] < min_accuracy or comps["format"] < min_format:
            continue
        key = (getattr(r["example"], "id", None), r["text"])
        if dedupe and key in seen:
            continue
        seen.add(key)
        kept.append(r)
    return kept


def fill_rows(prompts: list[str], completions: list[str], batch_size: int):
    """Repeats the rows cyclically until there are at least `batch_size` of them."""
    if not prompts:
        return prompts, completions
    reps = -(-batch_size // len(prompts))
    if reps <= 1:
        return prompts, completions
    return prompts * reps, completions * reps
