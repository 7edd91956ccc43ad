"""The two tiers every study runs at: the full tier on four main bases x two seeds, the mini
tier (the same pipeline at toy size) on one toy base.

Four bases, because the base is the unit that generalises: a verdict whose bases disagree by
more than its margin is not given on fewer (`summary.MIN_BASES`), and two seeds per base buy
the within-base spread the bases-as-blocks interval needs."""

from __future__ import annotations

from grpo_jax.studies.record import Tier

ONE_SEED = "seconds on 2 cores: one toy base, one seed"
FULL_BASES, FULL_SEEDS = (0, 1, 2, 3), (0, 1)
# The full tiers' costs were measured or estimated at two bases x three seeds (6 runs an arm).
COST_NOTE = "at 2 bases x 3 seeds; 4 x 2 runs 8 an arm, about 4/3 of it, and builds 4 bases"


def standard(full: str, mini: str = ONE_SEED, *, mini_seeds: tuple[int, ...] = (0,),
             mini_arms: tuple[str, ...] | None = None, full_sized: bool = False
             ) -> dict[str, Tier]:
    """{"full": bases 0-3 x seeds 0, 1; "mini": base 0 x `mini_seeds`, running `mini_arms`
    (None: all)}; `full` and `mini` are the tiers' costs: `full` at 2 bases x 3 seeds (said
    so) unless `full_sized` (an estimate already for four bases x two seeds)."""
    cost = full if full_sized else f"{full} ({COST_NOTE})"
    return {"full": Tier(bases=FULL_BASES, seeds=FULL_SEEDS, cost=cost),
            "mini": Tier(bases=(0,), seeds=mini_seeds, cost=mini, arms=mini_arms)}
