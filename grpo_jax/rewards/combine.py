"""Weighted sum of named rewards, each component kept for logging."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

RewardFn = Callable[[str, Any], float]


def combine(reward_fns: Mapping[str, RewardFn], weights: Mapping[str, float] | None = None):
    """Builds `fn(completion, example) -> (total, components)` with total = sum_i w_i r_i.

    Args:
      reward_fns: name -> reward function `(completion, example) -> float`.
      weights: name -> weight; a name missing here gets weight 1.0; a weight of 0 keeps the
        component in the log without adding it to the total.

    Returns:
      function returning (total: float, components: dict name -> unweighted float).

    Raises:
      ValueError: a weight names no reward, a weight is not finite, or (at call time) a
        reward returns a non-finite value.
    """
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(reward_fns))
    if unknown:
        raise ValueError(f"combine: weights for unknown rewards {unknown}; "
                         f"available: {sorted(reward_fns)}")
    for name, weight in weights.items():
        if not math.isfinite(float(weight)):
            raise ValueError(f"combine: weight {name!r} must be finite, got {weight}")
    resolved = {name: float(weights.get(name, 1.0)) for name in reward_fns}
    fns = dict(reward_fns)

    def combined(completion: str, example=None) -> tuple[float, dict[str, float]]:
        components = {}
        total = 0.0
        for name, fn in fns.items():
            value = float(fn(completion, example))
            if not math.isfinite(value):
                raise ValueError(f"combine: reward {name!r} returned {value}; rewards must be finite")
            components[name] = value
            total += resolved[name] * value
        return total, components

    return combined
