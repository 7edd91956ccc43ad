"""Soft overlong punishment of DAPO (Yu et al., 2025, https://arxiv.org/abs/2503.14476, eq. 13).

    R(L) = 0                               if L <= L_max - L_cache
         = ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
         = -1                              if L > L_max
"""

from __future__ import annotations

import numpy as np


def _check(max_length, cache_length):
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"overlong: need 0 < cache_length <= max_length, got cache_length={cache_length}, "
            f"max_length={max_length}"
        )


def overlong_penalty(lengths, *, max_length: int, cache_length: int):
    """DAPO soft overlong punishment of completion lengths (in tokens).

    Args:
      lengths: a length or an array of lengths [B] (tokens).
      max_length: L_max.
      cache_length: L_cache, the width of the linear ramp (0 < L_cache <= L_max).

    Returns:
      float for a scalar input, else float32 array [B], values in [-1, 0].
    """
    _check(max_length, cache_length)
    length = np.asarray(lengths, np.float64)
    start = max_length - cache_length
    penalty = np.clip((start - length) / cache_length, -1.0, 0.0)
    penalty = np.where(length > max_length, -1.0, penalty)
    if penalty.ndim == 0:
        return float(penalty)
    return penalty.astype(np.float32)


def overlong_reward(*, max_length: int, cache_length: int, tokenizer=None):
    """Reward function `(completion, example) -> float` applying `overlong_penalty`.

    The length is `len(tokenizer.encode(completion))`, or the number of characters when no
    tokenizer is given or when the tokenizer cannot encode the text. When token lengths are
    at hand (e.g. `SampleOutput.lengths`), call `overlong_penalty` on them directly.

    Args:
      max_length: L_max in tokens.
      cache_length: L_cache in tokens.
      tokenizer: optional object with `encode(text) -> list[int]`.

    Returns:
      reward function returning values in [-1, 0].
    """
    _check(max_length, cache_length)

    def reward(completion: str, example=None) -> float:
        del example
        if not isinstance(completion, str):
            return 0.0
        length = len(completion)
        if tokenizer is not None and length <= 8 * max_length + 64:
            try:
                length = len(tokenizer.encode(completion))
            except Exception:  # pylint: disable=broad-except
                pass
        return overlong_penalty(length, max_length=max_length, cache_length=cache_length)

    return reward
