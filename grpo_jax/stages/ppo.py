"""Stage kind "ppo": PPO with a critic and GAE in the shared RL loop.

The four roles (Ouyang et al. 2022, https://arxiv.org/abs/2203.02155): the policy (the
run's parameters), a separate critic (the policy's weights plus a zero-initialised scalar
head, trained with the clipped value loss), a frozen reference (the policy at the stage's
start) and the reward (rule rewards and / or a learned reward model). The pure pieces are
in grpo_jax.rl.ppo.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax.rl import ppo
from grpo_jax.rl.batch import minibatch_order, scan_minibatches
from grpo_jax.rl.reward_model import add_scalar_head, scalar_head_policy
from grpo_jax.runner import Learner, StageKind, rl_loop
from grpo_jax.runner.fields import LOOP, OFF_POLICY, SAMPLING, TOOLS, TRAINING, declare
from grpo_jax.runner.rl_loop import LoopSettings
from grpo_jax.runner.partial import PartialSource, host_source
from grpo_jax.runner.toolkit import stage_optimizer
from grpo_jax.training import init_opt_state

GROUPS = (LOOP, SAMPLING, OFF_POLICY, TOOLS, TRAINING)  # a ppo section's field groups


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "ppo" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "ppo"
    # steps, num_prompts, group_size, rewards, ..., tools, num_iterations, num_minibatches,
    # micro_batches, lr: the field groups (runner.fields)
    declare(s, *GROUPS)
    s.steps = 60  # PPO iterations (sample -> score -> GAE -> updates)
    s.group_size = 1  # completions per prompt (PPO needs no groups; > 1 is allowed)
    s.num_iterations = 2  # epochs over each rollout batch
    s.num_minibatches = 2  # optimizer steps per epoch
    s.lr = 1e-3  # policy learning rate
    s.critic_lr = 1e-3  # critic learning rate
    s.epsilon = 0.2  # policy ratio clip
    s.value_clip = 0.2  # value clip c (<= 0: unclipped value loss)
    s.gamma = 1.0  # discount over completion tokens
    s.lam = 0.95  # GAE lambda
    s.whiten_advantages = True  # normalise advantages over valid tokens of the batch
    s.beta = 0.05  # initial KL coefficient of the per-token reward (0 = no reference)
    s.adaptive_kl = False  # Ziegler et al. adaptive controller on beta
    s.kl_target = 0.05  # target KL per token of the adaptive controller
    s.kl_horizon = 10000  # horizon (samples) of the adaptive controller
    return s


def validate(check) -> None:
    section = check.section
    check.minibatches()
    check.positive("critic_lr")
    check.positive("epsilon")
    check.number("value_clip")
    check.number("gamma", low=0.0, high=1.0)
    check.number("lam", low=0.0, high=1.0)
    check.number("beta", low=0.0)
    if check.boolean("adaptive_kl"):
        if section.beta <= 0:
            check.fail("beta", "the adaptive KL controller needs beta > 0")
        check.positive("kl_target")
        check.positive("kl_horizon")
    if section.partial_tokens:  # the source the run will use checks what it cannot do
        PartialSource.check(check, LoopSettings.of(section, GROUPS))


class PPOLearner(Learner):
    """Per-token KL rewards and GAE at rollout time; clipped policy and value updates."""

    def __init__(self, run, stage):
        self.run, self.stage, self.section = run, stage, stage.section
        section = self.section
        self.updates_per_step = section.num_iterations * section.num_minibatches
        total = section.steps * self.updates_per_step
        optimizer, self.schedule = stage_optimizer(run, lr=section.lr, steps=total)
        critic_optimizer, _ = stage_optimizer(run, lr=section.critic_lr, steps=total)
        critic = scalar_head_policy(run.model_config,
                                    batch_streams=run.policy.batch_streams)
        critic_params = add_scalar_head(run.params)
        self.use_reference = section.beta > 0
        self.logs_staleness = section.max_staleness > 0
        self.state = {"params": run.params,
                      "opt_state": init_opt_state(optimizer, run.params, run.mesh),
                      "critic_params": critic_params,
                      "critic_opt_state": init_opt_state(critic_optimizer, critic_params,
                                                         run.mesh)}
        if self.use_reference:
            self.state["ref_params"] = jax.tree.map(jnp.copy, run.params)
        self.beta = float(section.beta)
        prompt_len = run.config.task.prompt_len
        self.prepare = ppo.make_prepare_fn(
            run.policy, critic, prompt_len=prompt_len, gamma=section.gamma,
            lambda_=section.lam, whiten_advantages=section.whiten_advantages,
            use_reference=self.use_reference,
            correction=section.off_policy_correction if section.max_staleness else None,
            is_cap=section.is_cap, mis_range=(section.mis_low, section.mis_high))
        self.update = ppo.make_ppo_update(
            run.policy, critic, optimizer, critic_optimizer, prompt_len=prompt_len,
            epsilon=section.epsilon,
            value_clip=section.value_clip if section.value_clip > 0 else None,
            micro_batches=section.micro_batches).fn

    def host_state(self) -> dict:
        return {"kl_coef": self.beta}

    def load_host_state(self, meta: dict) -> None:
        self.beta = float(meta.get("kl_coef", self.beta))

    def iteration(self, state, batch):
        """`state` carries the KL coefficient as "kl_coef" (a host value: `iterate`)."""
        section = self.section
        ref = state["ref_params"] if self.use_reference else state["params"]  # unused if no ref
        batch, rollout_metrics = self.prepare(state["params"], ref, state["critic_params"],
                                              batch, state["kl_coef"])

        def update(carry, minibatch):
            *carry, metrics = self.update(*carry, minibatch)
            return tuple(carry), metrics

        trained, metrics = scan_minibatches(
            update, (state["params"], state["opt_state"], state["critic_params"],
                     state["critic_opt_state"]), batch,
            num_iterations=section.num_iterations, num_minibatches=section.num_minibatches)
        metrics = {**metrics, **rollout_metrics}
        valid = jnp.maximum(jnp.sum(batch.loss_mask), 1)
        metrics["value_mean"] = jnp.sum(batch.old_values) / valid
        return {**state, **dict(zip(("params", "opt_state", "critic_params",
                                     "critic_opt_state"), trained))}, metrics

    def host_batch(self, batch, step):
        section = self.section
        order = minibatch_order(batch.rows, num_iterations=section.num_iterations,
                                num_minibatches=section.num_minibatches,
                                seed=(self.run.stage_seed(self.stage.name, "minibatches"),
                                      step))
        return batch if order is None else batch.replace(minibatch_order=order)

    def iterate(self, batch, step):
        section = self.section
        self.state["kl_coef"] = jnp.float32(self.beta)
        metrics = super().iterate(batch, step)
        del self.state["kl_coef"]
        metrics.update({"kl_coef": self.beta,
                        "loss": metrics["pg_loss"] + metrics["value_loss"]})
        if section.adaptive_kl:
            self.beta = ppo.adaptive_kl_coef(self.beta, metrics["kl_ref"],
                                             target=section.kl_target,
                                             horizon=section.kl_horizon,
                                             num_samples=batch.rows)
        return metrics

    def learning_rate(self, step):
        return float(self.schedule(step * self.updates_per_step))


def run_ppo(run, stage) -> None:
    rl_loop(run, stage, PPOLearner(run, stage),
            host_source(run, stage, LoopSettings.of(stage.section, GROUPS)))


KIND = StageKind("ppo", run_ppo, default_section, validate, rl_curves=True,
                 description="PPO with a critic, GAE and a per-token KL reward", groups=GROUPS)
