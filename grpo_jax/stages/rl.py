"""Stage kind "rl": the GRPO family (grpo, dr_grpo, dapo, rloo, reinforce,
expert_iteration) in the shared RL loop.

Each iteration: G completions per prompt -> rewards -> the algorithm's advantages -> mu
passes of the clipped surrogate + beta * KL to a frozen reference over minibatches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax.rewards.device import device_reward_names, integer_answers, make_device_reward
from grpo_jax.rl.algorithms import ALGORITHMS, compute_advantages, get_algorithm
from grpo_jax.rl.fused import FusedSettings, make_fused_iterations
from grpo_jax.rl.update import LossSettings, logp_mismatch, make_logp_fn, make_train_step
from grpo_jax.runner import ConfigError, Learner, StageKind, rl_loop
from grpo_jax.runner.rl_loop import fused_rl_loop, minibatches, reduce_update_metrics
from grpo_jax.runner.toolkit import section_sampling, stage_optimizer
from grpo_jax.sampling import check_prompt_groups
from grpo_jax.training import init_opt_state

LOSS_AGGREGATIONS = ("auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm")
SWITCH = ("auto", "on", "off")


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "rl" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "rl"
    s.algorithm = "grpo"  # grpo | dr_grpo | dapo | rloo | reinforce | expert_iteration
    s.steps = 80  # RL iterations (sample -> score -> update)
    s.num_prompts = 32  # N prompts per iteration
    s.group_size = 8  # G completions per prompt
    s.num_iterations = 1  # mu: passes over each rollout batch
    s.num_minibatches = 1  # optimizer steps per pass
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.lr = 2e-4  # peak learning rate
    s.beta = 0.01  # KL-to-reference coefficient (reference log-probs skipped if 0)
    s.kl_kind = "k3"  # k1 | k2 | k3
    s.epsilon = 0.2  # clip range (low side)
    s.epsilon_high = -1.0  # clip-higher (DAPO); < 0 means equal to epsilon (0.28 for dapo)
    s.dual_clip = -1.0  # dual-clip bound c > 1 for negative advantages; < 0 = off
    s.ratio_level = "token"  # token | sequence (GSPO)
    s.loss_agg = "auto"  # token-mean | seq-mean-token-mean | seq-mean-token-sum |
    #                      seq-mean-token-sum-norm | auto (the algorithm's own)
    s.adv_eps = 1e-6  # std floor in group normalisation
    s.temperature = 1.0  # rollout sampling temperature (the loss uses the same)
    s.top_k = 0  # 0 = off
    s.top_p = 1.0
    s.max_new_tokens = 40
    # Reward name -> weight. Names: the task's (accuracy, format, format_soft, ...), built-ins
    # (language, overlong) and stage-kind sources (reward_model, with reward_model set).
    s.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    s.reward_model = ""  # reward_model stage name (or directory) for the "reward_model" reward
    s.checkpoint_every = 20  # steps between checkpoints (and one at stage end)
    s.ref_reset_every = 0  # replace the reference by the policy every K steps; 0 = never
    # DAPO switches: "auto" = on for algorithm=dapo only | "on" | "off".
    s.dynamic_sampling = "auto"  # drop zero-variance groups and sample more prompts
    s.max_sampling_rounds = 4  # bound on sampling rounds per step (dynamic sampling)
    s.overlong_filter = "auto"  # truncated completions carry no loss
    s.overlong_cache = 0  # soft overlong punishment ramp L_cache (tokens); 0 = off
    # K > 0: each iteration (sample -> device rewards -> advantages -> update) runs on
    # device, K iterations per XLA program (one lax.scan, one host round trip). Needs
    # rewards with a device version (grpo_jax/rewards/device.py: accuracy, format) and a
    # character tokenizer; steps and checkpoint_every multiples of K; one update per
    # iteration, no dynamic sampling, overlong ramp or reference reset. 0 = host rewards.
    s.fused_steps = 0
    return s


def validate(check) -> None:
    section = check.section
    algorithm = ALGORITHMS[check.choice("algorithm", sorted(ALGORITHMS))]
    for field in ("steps", "num_prompts", "num_iterations", "num_minibatches",
                  "micro_batches", "max_sampling_rounds"):
        check.integer(field)
    g = check.integer("group_size")
    if algorithm.needs_groups and g < 2:
        check.fail("group_size", f"{section.algorithm} needs G >= 2 completions per prompt, "
                                 f"got {g}")
    check.minibatches()
    check.positive("lr")
    check.number("beta", low=0.0)
    check.choice("kl_kind", ("k1", "k2", "k3"))
    check.positive("epsilon")
    if section.epsilon_high >= 0:
        check.positive("epsilon_high")
    check.number("epsilon_high")
    check.number("dual_clip")
    if section.dual_clip > 0 and section.dual_clip <= 1:
        check.fail("dual_clip", f"expected a bound c > 1 (or < 0 for off), got "
                                f"{section.dual_clip}")
    check.choice("ratio_level", ("token", "sequence"))
    check.choice("loss_agg", LOSS_AGGREGATIONS)
    check.positive("adv_eps")
    check.positive("temperature")
    new = check.rl_loop_fields()
    check.integer("ref_reset_every", low=0)
    check.choice("dynamic_sampling", SWITCH)
    check.choice("overlong_filter", SWITCH)
    check.integer("overlong_cache", low=0, high=new)
    if check.integer("fused_steps", low=0):
        _validate_fused(check)


def _validate_fused(check) -> None:
    section, k = check.section, check.section.fused_steps
    for field in ("steps", "checkpoint_every"):
        if section[field] % k:
            check.fail("fused_steps", f"{field} {section[field]} is not a multiple of "
                                      f"fused_steps {k} (a program runs {k} iterations)")
    for field, allowed in (("num_iterations", 1), ("num_minibatches", 1),
                           ("overlong_cache", 0), ("ref_reset_every", 0)):
        if section[field] != allowed:
            check.fail("fused_steps", f"needs {field} = {allowed}, got {section[field]}")
    if _dapo_default(section, "dynamic_sampling"):
        check.fail("fused_steps", "needs dynamic_sampling = off (it resamples on the host)")
    missing = [name for name in section.rewards if name not in device_reward_names()]
    if missing:
        check.fail("fused_steps", f"reward {missing[0]!r} has no device version; device "
                                  f"rewards: {device_reward_names()}")
    if check.tokenizer is not None:  # a workdir-trained tokenizer is checked in the Run
        for name in section.rewards:
            try:
                make_device_reward(name, check.tokenizer)
            except ValueError as err:
                check.fail("fused_steps", str(err))


def _dapo_default(section, field: str) -> bool:
    """Resolves an "auto" | "on" | "off" switch whose auto value is on for dapo only."""
    if section[field] == "auto":
        return section.algorithm == "dapo"
    return section[field] == "on"


def loss_settings(section, *, on_policy: bool) -> LossSettings:
    """Static loss settings of an rl section (DAPO defaults to clip-higher 0.28)."""
    algorithm = get_algorithm(section.algorithm)
    epsilon_high = section.epsilon_high if section.epsilon_high >= 0 else None
    if epsilon_high is None and section.algorithm == "dapo":
        epsilon_high = 0.28  # clip-higher value of the DAPO paper (Yu et al., 2025)
    return LossSettings(
        epsilon=section.epsilon,
        epsilon_high=epsilon_high,
        dual_clip=section.dual_clip if section.dual_clip > 0 else None,
        ratio_level=section.ratio_level,
        beta=section.beta,
        kl_kind=section.kl_kind,
        loss_agg=algorithm.default_loss_agg if section.loss_agg == "auto" else section.loss_agg,
        on_policy=on_policy,
        temperature=section.temperature,
    )


class GRPOLearner(Learner):
    """Group-relative advantages and the clipped surrogate with a KL to the reference."""

    def __init__(self, run, stage):
        self.run, self.section, self.stage = run, stage.section, stage
        section = self.section
        self.updates_per_step = section.num_iterations * section.num_minibatches
        self.optimizer, self.schedule = stage_optimizer(
            run, lr=section.lr, steps=section.steps * self.updates_per_step)
        self.state = {"params": run.params,
                      "opt_state": init_opt_state(self.optimizer, run.params, run.mesh)}
        if section.beta != 0.0:
            self.state["ref_params"] = jax.tree.map(jnp.copy, run.params)
        self.on_policy = self.updates_per_step == 1
        prompt_len = run.config.task.prompt_len
        # A batch's rows are num_prompts groups of group_size completions of one prompt, so
        # the forward passes run each prompt once per group; random minibatches (more than
        # one) break the groups, so their updates do not share.
        whole_groups = section.group_size if section.num_minibatches == 1 else 1
        self.train_step = make_train_step(run.policy, self.optimizer,
                                          loss_settings(section, on_policy=self.on_policy),
                                          prompt_len=prompt_len,
                                          micro_batches=section.micro_batches,
                                          group_size=whole_groups)
        self.logp_fn = make_logp_fn(run.policy, prompt_len=prompt_len,
                                    temperature=section.temperature,
                                    group_size=section.group_size)
        self.overlong_filter = _dapo_default(section, "overlong_filter")

    def iterate(self, batch, rollout, step):
        section, state, run = self.section, self.state, self.run
        check_prompt_groups(rollout.prompt_tokens, rollout.prompt_mask, section.group_size)
        if "ref_params" in state and section.ref_reset_every and step > 0 \
                and step % section.ref_reset_every == 0:
            state["ref_params"] = jax.tree.map(jnp.copy, state["params"])  # DeepSeek-R1
        correct = rollout.components.get("accuracy", rollout.rewards) >= 1.0
        advantages = compute_advantages(rollout.rewards, algorithm=section.algorithm,
                                        group_size=section.group_size, correct=correct,
                                        eps=section.adv_eps)
        batch["advantages"] = jax.device_put(advantages, run.data_sharding)
        if self.overlong_filter:
            # Overlong filtering (DAPO): truncated completions carry no loss.
            batch["completion_mask"] = batch["completion_mask"] & ~jax.device_put(
                rollout.truncated[:, None], run.data_sharding)
        if "ref_params" in state:
            batch["ref_logp"] = self.logp_fn(state["ref_params"], batch["tokens"],
                                             batch["attention_mask"])
        mismatch = None
        if not self.on_policy:
            batch["old_logp"] = self.logp_fn(state["params"], batch["tokens"],
                                             batch["attention_mask"])
            mismatch = logp_mismatch(batch["old_logp"], batch["sample_logp"],
                                     batch["completion_mask"])
        collected = []
        for mb_batch in minibatches(batch, num_iterations=section.num_iterations,
                                    num_minibatches=section.num_minibatches,
                                    seed=(run.config.seed, self.stage.index, step)):
            state["params"], state["opt_state"], m = self.train_step(
                state["params"], state["opt_state"], mb_batch)
            collected.append(m)
        metrics = reduce_update_metrics(collected)
        if mismatch is not None:  # at the rollout's parameters, over the whole batch
            metrics.update({k: float(v) for k, v in jax.device_get(mismatch).items()})
        metrics["learning_rate"] = float(self.schedule(step * self.updates_per_step))
        return metrics


def run_fused(run, stage) -> None:
    """The rl stage with `fused_steps` iterations per XLA program (see rl.fused)."""
    section = stage.section
    if jax.process_count() > 1:
        raise ConfigError(f"{stage.name}.fused_steps: runs in one process only (this run "
                          f"has {jax.process_count()}); set it to 0")
    learner = GRPOLearner(run, stage)
    rewards = {name: make_device_reward(name, run.tokenizer) for name in section.rewards}
    fused = FusedSettings(algorithm=section.algorithm, group_size=section.group_size,
                          adv_eps=section.adv_eps, overlong_filter=learner.overlong_filter)
    program = make_fused_iterations(
        run.policy, learner.optimizer, loss_settings(section, on_policy=True), fused,
        sampling=section_sampling(run, section, temperature=section.temperature),
        rewards=rewards, weights=dict(section.rewards.to_dict()),
        prompt_len=run.config.task.prompt_len, micro_batches=section.micro_batches)

    def answers(examples):
        try:
            return integer_answers(examples)
        except ValueError as err:
            raise ConfigError(f"{stage.name}.fused_steps: {err}") from None

    fused_rl_loop(run, stage, learner, program=program, chunk=section.fused_steps,
                  answers_fn=answers, schedule=learner.schedule)


def run_rl(run, stage) -> None:
    section = stage.section
    if section.fused_steps:
        return run_fused(run, stage)
    rl_loop(run, stage, GRPOLearner(run, stage),
            sampling=section_sampling(run, section, temperature=section.temperature),
            dynamic=_dapo_default(section, "dynamic_sampling"),
            overlong_cache=section.overlong_cache)


KIND = StageKind("rl", run_rl, default_section, validate, rl_curves=True,
                 description="GRPO family: grpo, dr_grpo, dapo, rloo, reinforce, "
                             "expert_iteration")
