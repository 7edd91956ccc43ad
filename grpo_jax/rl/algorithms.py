"""Advantage estimators of the GRPO family and their loss defaults.

Each estimator maps the flat reward vector of one rollout batch (N prompts x G completions,
grouped contiguously) to one advantage per completion. The per-token loss is always the
clipped surrogate of `grpo_jax.losses` (with a single on-policy pass its ratio is exactly 1
and it reduces to REINFORCE with these advantages).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax import losses


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str
    needs_groups: bool  # requires group_size >= 2
    default_loss_agg: str
    description: str


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("grpo", True, "seq-mean-token-mean",
                  "group-normalised advantages (r - mean_g) / std_g (Shao et al., 2024)"),
        Algorithm("dr_grpo", True, "seq-mean-token-sum-norm",
                  "group mean baseline without std scaling, constant length norm (Liu et al., 2025)"),
        Algorithm("rloo", True, "token-mean",
                  "leave-one-out baseline within each group (Ahmadian et al., 2024)"),
        Algorithm("dapo", True, "token-mean",
                  "GRPO advantages with clip-higher, dynamic sampling, overlong filtering "
                  "(Yu et al., 2025)"),
        Algorithm("reinforce", False, "token-mean",
                  "REINFORCE with the batch-mean reward as baseline (Williams, 1992)"),
        Algorithm("expert_iteration", False, "token-mean",
                  "{0,1} reward without baseline: fine-tune on verified-correct samples"),
    )
}


def register_algorithm(algorithm: Algorithm) -> None:
    """Adds an estimator name (used by the PPO/DAPO/TRPO extensions)."""
    ALGORITHMS[algorithm.name] = algorithm


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(
            f"rl.algorithm: unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}"
        )
    return ALGORITHMS[name]


def compute_advantages(
    rewards: jax.Array,
    *,
    algorithm: str,
    group_size: int,
    correct: jax.Array | None = None,
    eps: float = 1e-6,
) -> jax.Array:
    """Per-completion advantages [N*G] for the named estimator.

    Args:
      rewards: [N*G] total rewards, the G completions of a prompt contiguous.
      algorithm: estimator name (see ALGORITHMS).
      group_size: G.
      correct: [N*G] {0,1} verified-correct indicator (used by expert_iteration).
      eps: std floor for group normalisation.
    Returns:
      [N*G] float32 advantages.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if algorithm in ("grpo", "dapo"):
        return losses.group_advantages(rewards, group_size=group_size, scale="group", eps=eps)
    if algorithm == "dr_grpo":
        return losses.group_advantages(rewards, group_size=group_size, scale="none", eps=eps)
    if algorithm == "rloo":
        return losses.rloo_advantages(rewards, group_size=group_size)
    if algorithm == "reinforce":
        return rewards - jnp.mean(rewards)
    if algorithm == "expert_iteration":
        if correct is None:
            raise ValueError("expert_iteration needs the verified-correct indicator `correct`")
        return jnp.asarray(correct, jnp.float32)
    raise ValueError(f"rl.algorithm: no advantage estimator for {algorithm!r}")
