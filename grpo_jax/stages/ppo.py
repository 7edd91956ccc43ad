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
from grpo_jax.rl.reward_model import add_scalar_head, scalar_head_policy
from grpo_jax.runner import Learner, StageKind, rl_loop
from grpo_jax.runner.rl_loop import minibatches, reduce_update_metrics
from grpo_jax.runner.toolkit import (add_off_policy_fields, add_tool_fields, section_sampling,
                                     stage_optimizer)
from grpo_jax.training import init_opt_state


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "ppo" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "ppo"
    s.steps = 60  # PPO iterations (sample -> score -> GAE -> updates)
    s.num_prompts = 32  # N prompts per iteration
    s.group_size = 1  # completions per prompt (PPO needs no groups; > 1 is allowed)
    s.num_iterations = 2  # epochs over each rollout batch
    s.num_minibatches = 2  # optimizer steps per epoch
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
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
    s.top_k = 0  # 0 = off (sampling is at temperature 1)
    s.top_p = 1.0
    s.max_new_tokens = 40
    # Reward name -> weight: task rewards, built-ins, or "reward_model" (with reward_model).
    s.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    s.reward_model = ""  # reward_model stage name (or directory) for the "reward_model" reward
    s.checkpoint_every = 20  # steps between checkpoints (0 = only at the end)
    s.overlong_cache = 0  # soft overlong punishment ramp L_cache (tokens); 0 = off
    add_off_policy_fields(s)
    add_tool_fields(s)
    return s


def validate(check) -> None:
    section = check.section
    for field in ("steps", "num_prompts", "group_size", "num_iterations", "num_minibatches"):
        check.integer(field)
    check.minibatches()
    check.positive("lr")
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
    check.rl_loop_fields()
    check.off_policy_fields()
    check.tool_fields()


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
            micro_batches=section.micro_batches)

    def host_state(self) -> dict:
        return {"kl_coef": self.beta}

    def load_host_state(self, meta: dict) -> None:
        self.beta = float(meta.get("kl_coef", self.beta))

    def iterate(self, batch, rollout, step):
        section, state, run = self.section, self.state, self.run
        ref = state["ref_params"] if self.use_reference else state["params"]  # unused if no ref
        batch, rollout_metrics = self.prepare(state["params"], ref, state["critic_params"],
                                              batch, jnp.float32(self.beta))
        collected = []
        seed = (run.stage_seed(self.stage.index, "minibatches"), step)
        for mb_batch in minibatches(batch, num_iterations=section.num_iterations,
                                    num_minibatches=section.num_minibatches, seed=seed):
            (state["params"], state["opt_state"], state["critic_params"],
             state["critic_opt_state"], m) = self.update(
                state["params"], state["opt_state"], state["critic_params"],
                state["critic_opt_state"], mb_batch)
            collected.append(m)
        metrics = reduce_update_metrics(collected)
        rollout_metrics = {k: float(v) for k, v in jax.device_get(rollout_metrics).items()}
        valid = jnp.maximum(jnp.sum(batch.loss_mask), 1)
        metrics.update(rollout_metrics)
        metrics.update({
            "kl_coef": self.beta,
            "value_mean": float(jnp.sum(batch.old_values) / valid),
            "loss": metrics["pg_loss"] + metrics["value_loss"],
            "learning_rate": float(self.schedule(step * self.updates_per_step)),
        })
        if section.adaptive_kl:
            self.beta = ppo.adaptive_kl_coef(self.beta, metrics["kl_ref"],
                                             target=section.kl_target,
                                             horizon=section.kl_horizon,
                                             num_samples=len(rollout.rewards))
        return metrics


def run_ppo(run, stage) -> None:
    rl_loop(run, stage, PPOLearner(run, stage), sampling=section_sampling(run, stage.section))


KIND = StageKind("ppo", run_ppo, default_section, validate, rl_curves=True,
                 description="PPO with a critic, GAE and a per-token KL reward")
