"""Pure-functional RL loss kernels: arrays in, arrays out, float32 (or wider) inside.

Each kernel returns per-token / per-example values; reductions live in `aggregate`.
"""

from grpo_jax.losses.advantages import (
    group_advantages,
    optimal_baseline,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from grpo_jax.losses.aggregate import MODES as AGGREGATION_MODES
from grpo_jax.losses.aggregate import aggregate
from grpo_jax.losses.gae import (
    discounted_returns,
    gae,
    kstep_advantages,
    td_residuals,
    token_gae,
)
from grpo_jax.losses.kl import full_kl, kl_penalty
from grpo_jax.losses.policy_gradient import policy_gradient
from grpo_jax.losses.surrogate import cispo_surrogate, clipped_surrogate, value_loss
from grpo_jax.losses.trpo import (
    LineSearchResult,
    backtracking_line_search,
    categorical_fisher_operator,
    conjugate_gradient,
    fisher_vector_product,
    natural_gradient_step,
)

__all__ = [
    "AGGREGATION_MODES",
    "LineSearchResult",
    "aggregate",
    "backtracking_line_search",
    "categorical_fisher_operator",
    "cispo_surrogate",
    "clipped_surrogate",
    "conjugate_gradient",
    "discounted_returns",
    "fisher_vector_product",
    "full_kl",
    "gae",
    "group_advantages",
    "kl_penalty",
    "kstep_advantages",
    "natural_gradient_step",
    "optimal_baseline",
    "policy_gradient",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "td_residuals",
    "token_gae",
    "value_loss",
    "whiten",
]
