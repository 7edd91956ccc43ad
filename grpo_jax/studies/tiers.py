"""The two tiers every study runs at: the full tier on the two main bases x three seeds, the
mini tier (the same pipeline at toy size) on one toy base."""

from __future__ import annotations

from grpo_jax.studies.record import Tier

ONE_SEED = "seconds on 2 cores: one toy base, one seed"


def standard(full: str, mini: str = ONE_SEED, *, mini_seeds: tuple[int, ...] = (0,),
             mini_arms: tuple[str, ...] | None = None) -> dict[str, Tier]:
    """{"full": bases 0 and 1 x seeds 0, 1, 2; "mini": base 0 x `mini_seeds`, running
    `mini_arms` (None: all)}; `full` and `mini` are the tiers' costs."""
    return {"full": Tier(bases=(0, 1), seeds=(0, 1, 2), cost=full),
            "mini": Tier(bases=(0,), seeds=mini_seeds, cost=mini, arms=mini_arms)}
