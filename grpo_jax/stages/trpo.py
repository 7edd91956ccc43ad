"""Stage kind "trpo": one natural-gradient step per rollout batch, on group-normalised
advantages, in the shared RL loop (the step itself is grpo_jax.rl.trpo.make_trpo_step)."""

from __future__ import annotations

import ml_collections

from grpo_jax import losses
from grpo_jax.rl import trpo
from grpo_jax.runner import Learner, StageKind, rl_loop
from grpo_jax.runner.fields import LOOP, SAMPLING, declare
from grpo_jax.runner.rl_loop import LoopSettings
from grpo_jax.runner.sources import HostSource

GROUPS = (LOOP, SAMPLING)  # the shared field groups of a trpo section


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "trpo" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "trpo"
    declare(s, *GROUPS)  # steps, num_prompts, group_size, rewards, ..., top_p (runner.fields)
    s.steps = 30  # TRPO iterations (one natural-gradient step per rollout batch)
    s.num_prompts = 16  # N prompts per iteration
    s.checkpoint_every = 10  # steps between checkpoints (0 = only at the end)
    s.adv_eps = 1e-6  # std floor in group normalisation
    s.max_kl = 0.01  # delta: trust-region radius in mean KL per token
    s.damping = 0.1  # Tikhonov damping of the Fisher-vector product
    s.cg_iters = 10  # conjugate gradient iterations
    # Fraction of the batch's rows the Fisher-vector products use (evenly spaced; 1.0 =
    # all; Schulman's thesis, EECS-2016-217, uses 0.1: the Fisher only sets the metric).
    s.fisher_fraction = 1.0
    s.backtrack_ratio = 0.5  # line-search shrink factor
    s.max_backtracks = 10  # line-search candidates
    s.accept_ratio = 0.1  # smallest actual / expected improvement accepted
    return s


def validate(check) -> None:
    section = check.section
    for field in ("cg_iters", "max_backtracks"):
        check.integer(field)
    if section.group_size < 2:
        check.fail("group_size", f"trpo uses group-normalised advantages and needs G >= 2, "
                                 f"got {section.group_size}")
    check.divides("num_prompts", section.num_prompts * section.group_size, micro_field=None,
                  what=f"rollout batch N*G = {section.num_prompts * section.group_size}")
    check.positive("adv_eps")
    check.positive("max_kl")
    check.number("damping", low=0.0)
    check.number("fisher_fraction", low=0.0, high=1.0, low_open=True)
    check.number("backtrack_ratio", low=0.0, high=1.0, low_open=True, high_open=True)
    check.number("accept_ratio", low=0.0)


class TRPOLearner(Learner):
    """The natural-gradient step: no optimizer state, only the parameters."""

    def __init__(self, run, stage):
        section = stage.section
        self.run, self.section = run, section
        self.state = {"params": run.params}
        self.step_fn = trpo.make_trpo_step(
            run.policy, prompt_len=run.config.task.prompt_len, max_kl=section.max_kl,
            damping=section.damping, cg_iters=section.cg_iters,
            backtrack_ratio=section.backtrack_ratio, max_backtracks=section.max_backtracks,
            accept_ratio=section.accept_ratio, fisher_fraction=section.fisher_fraction)

    def iteration(self, state, batch):
        advantages = losses.group_advantages(batch.rewards, group_size=self.section.group_size,
                                             scale="group", eps=self.section.adv_eps)
        params, metrics = self.step_fn(state["params"], batch.with_advantages(advantages))
        return {**state, "params": params}, metrics

    def iterate(self, batch, step):
        metrics = super().iterate(batch, step)
        metrics["loss"] = -metrics["surrogate_gain"]
        return metrics


def run_trpo(run, stage) -> None:
    rl_loop(run, stage, TRPOLearner(run, stage),
            HostSource(run, stage, LoopSettings.of(stage.section, GROUPS)))


KIND = StageKind("trpo", run_trpo, default_section, validate, rl_curves=True,
                 description="TRPO: conjugate-gradient natural step with a KL line search",
                 groups=GROUPS)
