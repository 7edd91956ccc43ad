"""Rewards that carry no information about correctness, for the spurious-reward ablations of
Shao et al. 2025 ("Spurious Rewards: Rethinking Training Signals in RLVR", arXiv:2506.10947):
a coin flip, and a reward for being wrong. (Their third, a format-only reward, is the
"format" reward alone.)

    coin = random_reward(seed=0, probability=0.5)
    coin("<answer>7</answer>", example)        # 1.0 or 0.0, independent of the answer
    wrong = incorrect_reward(accuracy_fn)
    wrong(completion, example)                  # 1 - accuracy_fn(completion, example)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

__all__ = ["incorrect_reward", "random_reward"]


def random_reward(seed: int = 0, probability: float = 0.5) -> Callable[[str, object], float]:
    """A reward of 1 with `probability`, else 0, drawn from a hash of (seed, the problem's
    id, the completion): independent of correctness, the same on every resume and device,
    and the same for two identical completions of one problem (a coin per distinct
    answer, not per sample)."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"random_reward: probability must be in [0, 1], got {probability}")

    def coin(completion: str, example) -> float:
        key = f"{seed}\0{getattr(example, 'id', '')}\0{completion}".encode()
        draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64
        return float(draw < probability)

    return coin


def incorrect_reward(accuracy: Callable[[str, object], float]) -> Callable[[str, object], float]:
    """1 for a completion the task's accuracy reward scores 0 (a wrong or missing answer),
    0 for a correct one: 1 - accuracy, clipped to [0, 1]."""

    def wrong(completion: str, example) -> float:
        return float(min(max(1.0 - float(accuracy(completion, example)), 0.0), 1.0))

    return wrong
