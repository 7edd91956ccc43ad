"""The GRPO family as a table: one `Algorithm` record per variant.

A record says everything that makes a variant: its advantage estimator, its policy
objective (the clipped surrogate or CISPO's clipped weight), where the KL to the reference
goes (a loss term, or a per-token penalty folded into the reward before the estimator),
and its defaults for the hyper-parameters a config leaves on "auto" (loss aggregation,
clip range, ratio level, KL coefficient and estimator, DAPO's switches). Every list of
algorithm names (validation, the config comment, docs, tests) is derived from
`ALGORITHMS`; nothing outside this module asks which algorithm it is running.

Adding a variant made of existing kernels is one record here (plus its tests); a new
kernel goes to `grpo_jax.losses` first.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax import losses

KL_PLACEMENTS = ("loss", "reward")
LOSS_AGGREGATIONS = tuple(losses.AGGREGATION_MODES)


class Objective(enum.StrEnum):
    """A policy objective: its name (a member equals its string, e.g. "cispo") and its
    per-token loss (`loss`), as the estimator is the advantages' callable."""

    CLIP = "clip"  # PPO's clipped surrogate: token or sequence ratio, optional dual clip
    CISPO = "cispo"  # CISPO's clipped importance weight under a stop-gradient

    @property
    def token_ratio_only(self) -> bool:
        """Each token is weighted by its own clipped ratio: no sequence-level ratio and no
        dual clip (validation refuses them)."""
        return self is Objective.CISPO

    def loss(self, logp, old_logp, advantages, *, epsilon: float, epsilon_high: float | None,
             dual_clip: float | None, ratio_level: str, mask):
        """(per-token loss [B, N], clipped [B, N] bool): `losses.clipped_surrogate` or
        `losses.cispo_surrogate` of the sampled tokens' log-probs under the current and the
        old policy, with per-token advantages [B, N]."""
        if self.token_ratio_only:
            return losses.cispo_surrogate(logp, old_logp, advantages, epsilon=epsilon,
                                          epsilon_high=epsilon_high, mask=mask)
        return losses.clipped_surrogate(logp, old_logp, advantages, epsilon=epsilon,
                                        epsilon_high=epsilon_high, dual_clip=dual_clip,
                                        mask=mask, ratio_level=ratio_level)


@dataclasses.dataclass(frozen=True)
class EstimatorInputs:
    """What an advantage estimator may read (each uses what it needs).

    rewards: [B] total rewards, G completions of a prompt contiguous; correct: [B] bool
    verified-correct indicator; mask: [B, N] loss mask; token_penalty: [B, N] beta times the
    per-token KL to the reference when the algorithm puts the KL in the reward, else None.
    """

    rewards: jax.Array
    correct: jax.Array
    mask: jax.Array
    group_size: int
    eps: float = 1e-6
    token_penalty: jax.Array | None = None


Estimator = Callable[[EstimatorInputs], jax.Array]  # -> [B] or [B, N] advantages


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved hyper-parameters of a GRPO-family stage (no "auto" left)."""

    epsilon: float
    epsilon_high: float
    beta: float
    kl_kind: str
    ratio_level: str
    loss_agg: str
    dynamic_sampling: bool
    overlong_filter: bool


# The value of every "auto" hyper-parameter unless a record overrides it. epsilon_high
# defaults to the resolved epsilon (a symmetric clip).
BASE_DEFAULTS: Mapping[str, Any] = {
    "epsilon": 0.2, "epsilon_high": None, "beta": 0.01, "kl_kind": "k3",
    "ratio_level": "token", "dynamic_sampling": False, "overlong_filter": False,
}
AUTO_FIELDS = (*BASE_DEFAULTS, "loss_agg")


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One GRPO-family variant.

    Attributes:
      name: the value of `rl.algorithm`.
      estimator: EstimatorInputs -> advantages [B] (per sequence) or [B, N] (per token).
      loss_agg: its loss aggregation (`grpo_jax.losses.aggregate` mode).
      description: one line with the paper.
      needs_groups: the estimator needs G >= 2 completions per prompt.
      objective: its `Objective` (PPO's clipped surrogate, token or sequence ratio, or
        CISPO's clipped weight); a name is accepted and made the member.
      kl_placement: "loss" (beta * KL per token in the loss) or "reward" (beta * KL per
        token subtracted from the reward before the estimator; no KL term in the loss).
      defaults: overrides of BASE_DEFAULTS for fields left on "auto".
    """

    name: str
    estimator: Estimator
    loss_agg: str
    description: str
    needs_groups: bool = True
    objective: Objective = Objective.CLIP
    kl_placement: str = "loss"
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.objective not in [o.value for o in Objective]:
            raise ValueError(f"{self.name}: objective {self.objective!r} not in "
                             f"{tuple(o.value for o in Objective)}")
        object.__setattr__(self, "objective", Objective(self.objective))
        if self.kl_placement not in KL_PLACEMENTS:
            raise ValueError(f"{self.name}: kl_placement {self.kl_placement!r} not in "
                             f"{KL_PLACEMENTS}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise ValueError(f"{self.name}: loss_agg {self.loss_agg!r} not in "
                             f"{LOSS_AGGREGATIONS}")
        unknown = set(self.defaults) - set(BASE_DEFAULTS)
        if unknown:
            raise ValueError(f"{self.name}: defaults for unknown fields {sorted(unknown)}")

    def resolve(self, **given) -> Settings:
        """Settings from the given values, None (or "auto") meaning this record's default.

        Keys: the names of `Settings`' fields; a missing key is "auto".
        """
        unknown = set(given) - set(AUTO_FIELDS)
        if unknown:
            raise ValueError(f"resolve: unknown fields {sorted(unknown)}")
        values = {**BASE_DEFAULTS, "loss_agg": self.loss_agg, **self.defaults}
        values.update({k: v for k, v in given.items() if v is not None and v != "auto"})
        if values["epsilon_high"] is None:
            values["epsilon_high"] = values["epsilon"]
        return Settings(**values)


# ------------------------------------------------------------------------- estimators

def _group_normalised(inputs: EstimatorInputs) -> jax.Array:
    return losses.group_advantages(inputs.rewards, group_size=inputs.group_size,
                                   scale="group", eps=inputs.eps)


def _group_centred(inputs: EstimatorInputs) -> jax.Array:
    return losses.group_advantages(inputs.rewards, group_size=inputs.group_size,
                                   scale="none", eps=inputs.eps)


def _leave_one_out(inputs: EstimatorInputs) -> jax.Array:
    return losses.rloo_advantages(inputs.rewards, group_size=inputs.group_size)


def _batch_mean_baseline(inputs: EstimatorInputs) -> jax.Array:
    rewards = jnp.asarray(inputs.rewards, jnp.float32)
    return rewards - jnp.mean(rewards)


def _verified_only(inputs: EstimatorInputs) -> jax.Array:
    return jnp.asarray(inputs.correct, jnp.float32)


def _reinforce_pp(inputs: EstimatorInputs) -> jax.Array:
    return losses.reinforce_pp_advantages(inputs.rewards, inputs.mask,
                                          token_penalty=inputs.token_penalty)


ALGORITHMS: Mapping[str, Algorithm] = {a.name: a for a in (
    Algorithm("grpo", _group_normalised, "seq-mean-token-mean",
              "group-normalised advantages (r - mean_g) / std_g (Shao et al., 2024, "
              "arXiv:2402.03300)"),
    Algorithm("dr_grpo", _group_centred, "seq-mean-token-sum-norm",
              "group mean baseline without std scaling, constant length normalisation "
              "(Liu et al., 2025, arXiv:2503.20783)"),
    Algorithm("dapo", _group_normalised, "token-mean",
              "GRPO advantages with clip-higher 0.28, dynamic sampling, overlong filtering "
              "and no KL (Yu et al., 2025, arXiv:2503.14476)",
              defaults={"epsilon_high": 0.28, "beta": 0.0, "dynamic_sampling": True,
                        "overlong_filter": True}),
    Algorithm("gspo", _group_normalised, "seq-mean-token-mean",
              "sequence-level ratio (length-normalised) clipped to [1 - 3e-4, 1 + 4e-4] "
              "(Zheng et al., 2025, arXiv:2507.18071)",
              defaults={"ratio_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}),
    Algorithm("cispo", _group_normalised, "token-mean",
              "clipped importance weight under a stop-gradient, so every token keeps a "
              "gradient; no lower bound, upper 1.28, no KL (MiniMax, 2025, "
              "arXiv:2506.13585)",
              # The paper tunes only the upper bound and does not publish it; 0.28 is
              # DAPO's clip-higher and Trinity-RFT's CISPO default. epsilon 1: w >= 0.
              objective=Objective.CISPO, defaults={"epsilon": 1.0, "epsilon_high": 0.28, "beta": 0.0}),
    Algorithm("rloo", _leave_one_out, "token-mean",
              "leave-one-out baseline within each group (Ahmadian et al., 2024, "
              "arXiv:2402.14740)"),
    Algorithm("reinforce", _batch_mean_baseline, "token-mean",
              "REINFORCE with the batch-mean reward as baseline (Williams, 1992)",
              needs_groups=False),
    Algorithm("reinforce_pp", _reinforce_pp, "token-mean",
              "REINFORCE++: k1 KL per token in the reward, return-to-go whitened over the "
              "global batch, no critic (Hu, 2025, arXiv:2501.03262)",
              needs_groups=False, kl_placement="reward", defaults={"kl_kind": "k1"}),
    Algorithm("expert_iteration", _verified_only, "token-mean",
              "{0,1} reward without baseline: fine-tune on verified-correct samples",
              needs_groups=False),
)}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(
            f"rl.algorithm: unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}"
        )
    return ALGORITHMS[name]


def compute_advantages(algorithm: str | Algorithm, inputs: EstimatorInputs) -> jax.Array:
    """Per-token advantages [B, N] of the named estimator (per-sequence ones broadcast).

    Args:
      algorithm: a name in ALGORITHMS or a record.
      inputs: the rollout's rewards, correctness, loss mask and (KL-in-reward algorithms)
        per-token penalty.

    Returns:
      [B, N] float32 advantages.
    """
    if isinstance(algorithm, str):
        algorithm = get_algorithm(algorithm)
    advantages = jnp.asarray(algorithm.estimator(inputs), jnp.float32)
    mask = jnp.asarray(inputs.mask)
    if advantages.ndim == 1:
        advantages = jnp.broadcast_to(advantages[:, None], mask.shape)
    if advantages.shape != mask.shape:
        raise ValueError(f"{algorithm.name}: the estimator returned advantages of shape "
                         f"{advantages.shape}, expected [B]={mask.shape[:1]} or [B, N]="
                         f"{mask.shape}")
    return advantages
