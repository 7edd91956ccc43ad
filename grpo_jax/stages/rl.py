"""Stage kind "rl": the GRPO family (every record of `grpo_jax.rl.algorithms.ALGORITHMS`)
in the shared RL loop.

Each iteration: G completions per prompt -> rewards -> the rollout batch -> the
algorithm's reference log-probs and advantages -> mu passes of its objective (+ beta * KL
and the entropy bonus) over minibatches. Nothing here depends on which algorithm runs:
its record says it.
"""

from __future__ import annotations

import jax
import ml_collections
from ml_collections.config_dict import placeholder

from grpo_jax.models import lora
from grpo_jax.rewards.device import device_reward_names, integer_answers, make_device_reward
from grpo_jax.rl.algorithms import ALGORITHMS, AUTO_FIELDS, LOSS_AGGREGATIONS, get_algorithm
from grpo_jax.rl.fused import make_fused_iterations
from grpo_jax.rl.update import LossSettings, make_prepare_fn, make_train_step
from grpo_jax.runner import ConfigError, Learner, StageKind, rl_loop
from grpo_jax.runner.rl_loop import fused_rl_loop, minibatches, reduce_update_metrics
from grpo_jax.runner.toolkit import (add_off_policy_fields, add_tool_fields, section_sampling,
                                     stage_optimizer)
from grpo_jax.sampling import check_prompt_groups
from grpo_jax.training import init_opt_state

SWITCH = ("auto", "on", "off")


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "rl" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "rl"
    s.algorithm = "grpo"  # a name in grpo_jax/rl/algorithms.py (ALGORITHMS)
    s.steps = 80  # RL iterations (sample -> score -> update)
    s.num_prompts = 32  # N prompts per iteration
    s.group_size = 8  # G completions per prompt
    s.num_iterations = 1  # mu: passes over each rollout batch
    s.num_minibatches = 1  # optimizer steps per pass
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.lr = 2e-4  # peak learning rate
    # Fields below left unset (None) or on "auto" take the algorithm's default: its record
    # in grpo_jax/rl/algorithms.py (`--print_config` shows the resolved values). Otherwise
    # beta 0.01, kl_kind k3, epsilon 0.2, epsilon_high = epsilon, ratio_level token; e.g.
    # DAPO: epsilon_high 0.28, beta 0, dynamic sampling and overlong filter on; GSPO:
    # sequence ratio, epsilon 3e-4 / 4e-4.
    s.beta = placeholder(float)  # KL-to-reference coefficient (0: no reference)
    s.kl_kind = "auto"  # k1 | k2 | k3 | auto
    s.epsilon = placeholder(float)  # clip range (low side)
    s.epsilon_high = placeholder(float)  # clip-higher (DAPO's 0.28)
    s.dual_clip = -1.0  # dual-clip bound c > 1 for negative advantages; < 0 = off
    s.ratio_level = "auto"  # token | sequence (GSPO) | auto
    s.loss_agg = "auto"  # token-mean | seq-mean-token-mean | seq-mean-token-sum |
    #                      seq-mean-token-sum-norm | auto
    s.entropy_coef = 0.0  # entropy bonus: the loss subtracts entropy_coef * entropy
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
    # DAPO's switches: "auto" (the algorithm's default: on for dapo) | "on" | "off".
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
    add_off_policy_fields(s)
    add_tool_fields(s)
    return s


def settings(section):
    """(Algorithm record, its resolved Settings) of an rl section."""
    algorithm = get_algorithm(section.algorithm)
    given = {}
    for field in AUTO_FIELDS:
        value = section[field]
        if field in ("dynamic_sampling", "overlong_filter"):
            value = None if value == "auto" else value == "on"
        given[field] = value
    return algorithm, algorithm.resolve(**given)


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
    if section.beta is not None:  # None: the algorithm's default
        check.number("beta", low=0.0)
    for field in ("epsilon", "epsilon_high"):
        if section[field] is not None:
            check.positive(field)
    check.choice("kl_kind", ("auto", "k1", "k2", "k3"))
    check.number("dual_clip")
    if section.dual_clip > 0 and section.dual_clip <= 1:
        check.fail("dual_clip", f"expected a bound c > 1 (or < 0 for off), got "
                                f"{section.dual_clip}")
    check.choice("ratio_level", ("auto", "token", "sequence"))
    check.choice("loss_agg", ("auto", *LOSS_AGGREGATIONS))
    check.number("entropy_coef", low=0.0)
    check.positive("adv_eps")
    check.positive("temperature")
    check.rl_loop_fields()  # also overlong_cache <= max_new_tokens
    check.integer("ref_reset_every", low=0)
    check.choice("dynamic_sampling", SWITCH)
    check.choice("overlong_filter", SWITCH)
    _, resolved = settings(section)
    if algorithm.objective == "cispo":
        for field, off in (("ratio_level", resolved.ratio_level == "token"),
                           ("dual_clip", section.dual_clip < 0)):
            if not off:
                check.fail(field, f"{section.algorithm} weights each token by its own "
                                  f"clipped ratio; leave {field} on its default")
    check.off_policy_fields()
    check.tool_fields()
    if check.integer("fused_steps", low=0):
        _validate_fused(check)


def _validate_fused(check) -> None:
    section, k = check.section, check.section.fused_steps
    if section.tools:
        check.fail("fused_steps", f"multi-turn episodes (tools {section.tools!r}) need the "
                                  "host between turns: set fused_steps to 0")
    for field in ("steps", "checkpoint_every"):
        if section[field] % k:
            check.fail("fused_steps", f"{field} {section[field]} is not a multiple of "
                                      f"fused_steps {k} (a program runs {k} iterations)")
    for field, allowed in (("num_iterations", 1), ("num_minibatches", 1),
                           ("overlong_cache", 0), ("ref_reset_every", 0),
                           ("max_staleness", 0)):
        if section[field] != allowed:
            check.fail("fused_steps", f"needs {field} = {allowed}, got {section[field]}")
    if settings(section)[1].dynamic_sampling:
        check.fail("fused_steps", "needs dynamic_sampling = off (it resamples on the host)")
    if check.config.mesh.get("rollout_devices", 0):
        check.fail("fused_steps", "samples and trains in one program on one mesh: set "
                                  "mesh.rollout_devices to 0 or fused_steps to 0")
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


def kl_warning(section) -> str | None:
    """A warning for a KL term that does nothing: k1 in the loss has zero gradient in
    expectation (`losses.kl_penalty`)."""
    algorithm, resolved = settings(section)
    if resolved.beta and resolved.kl_kind == "k1" and algorithm.kl_placement == "loss":
        return ("kl_kind k1 in the loss has zero gradient in expectation, so beta "
                f"{resolved.beta} pulls nothing towards the reference; use k3 (the gradient of "
                "KL(ref || pi), GRPO's) or k2 (of KL(pi || ref))")
    return None


def summary(section) -> str:
    """The algorithm and its resolved hyper-parameters, for `--print_config`."""
    algorithm, resolved = settings(section)
    kl = "no KL" if resolved.beta == 0 else \
        f"beta {resolved.beta} ({resolved.kl_kind} in the {algorithm.kl_placement})"
    switches = [name for name in ("dynamic_sampling", "overlong_filter")
                if getattr(resolved, name)]
    return (f"{algorithm.name}: {algorithm.objective} objective, epsilon {resolved.epsilon} / "
            f"{resolved.epsilon_high}, {resolved.ratio_level} ratio, {kl}, "
            f"{resolved.loss_agg}, entropy_coef {section.entropy_coef}"
            + (f", {' and '.join(switches)}" if switches else "")
            + (f"; warning: {kl_warning(section)}" if kl_warning(section) else ""))


def loss_settings(section, *, on_policy: bool) -> LossSettings:
    """Static loss settings of an rl section."""
    algorithm, resolved = settings(section)
    return LossSettings.for_algorithm(
        algorithm, resolved, on_policy=on_policy, temperature=section.temperature,
        dual_clip=section.dual_clip if section.dual_clip > 0 else None,
        entropy_coef=section.entropy_coef)


class GRPOLearner(Learner):
    """The GRPO family: the algorithm's advantages and objective, a KL to the reference."""

    def __init__(self, run, stage):
        self.run, self.section, self.stage = run, stage.section, stage
        section = self.section
        self.algorithm, self.settings = settings(section)
        self.updates_per_step = section.num_iterations * section.num_minibatches
        self.optimizer, self.schedule = stage_optimizer(
            run, lr=section.lr, steps=section.steps * self.updates_per_step)
        self.state = {"params": run.params,
                      "opt_state": init_opt_state(self.optimizer, run.params, run.mesh)}
        if self.settings.beta != 0.0:  # with LoRA: the adapters copied, the base shared
            self.state["ref_params"] = lora.copy_trainable(run.params)
        # Stale rollouts (max_staleness > 0) are off-policy whatever the update count.
        stale = section.max_staleness > 0
        self.on_policy = self.updates_per_step == 1 and not stale
        prompt_len = run.config.task.prompt_len
        self.loss = loss_settings(section, on_policy=self.on_policy)
        # A batch's rows are num_prompts groups of group_size completions of one prompt, so
        # the forward passes run each prompt once per group; random minibatches (more than
        # one) break the groups, so their updates do not share.
        whole_groups = section.group_size if section.num_minibatches == 1 else 1
        self.train_step = make_train_step(run.policy, self.optimizer, self.loss,
                                          prompt_len=prompt_len,
                                          micro_batches=section.micro_batches,
                                          group_size=whole_groups)
        self.prepare = make_prepare_fn(run.policy, self.algorithm, self.settings,
                                       prompt_len=prompt_len, temperature=section.temperature,
                                       group_size=section.group_size,
                                       adv_eps=section.adv_eps, on_policy=self.on_policy,
                                       micro_batches=section.micro_batches
                                       * section.num_minibatches,
                                       correction=section.off_policy_correction if stale
                                       else None, is_cap=section.is_cap,
                                       mis_range=(section.mis_low, section.mis_high))
        self.prepare_jit = jax.jit(self.prepare)

    def iterate(self, batch, rollout, step):
        section, state, run = self.section, self.state, self.run
        check_prompt_groups(rollout.prompt_tokens, rollout.prompt_mask, section.group_size)
        if "ref_params" in state and section.ref_reset_every and step > 0 \
                and step % section.ref_reset_every == 0:
            state["ref_params"] = lora.copy_trainable(state["params"])  # DeepSeek-R1
        correct = rollout.components.get("accuracy", rollout.rewards) >= 1.0
        flags = jax.device_put((correct, rollout.truncated), run.data_sharding)
        batch, prep_metrics = self.prepare_jit(state["params"], state.get("ref_params"),
                                               batch, *flags)
        collected = []
        seed = (run.stage_seed(self.stage.index, "minibatches"), step)
        for mb_batch in minibatches(batch, num_iterations=section.num_iterations,
                                    num_minibatches=section.num_minibatches, seed=seed):
            state["params"], state["opt_state"], m = self.train_step(
                state["params"], state["opt_state"], mb_batch)
            collected.append(m)
        metrics = reduce_update_metrics(collected)
        # The recomputed log-probs' mismatch is at the rollout's parameters, over the batch.
        metrics.update({k: float(v) for k, v in jax.device_get(prep_metrics).items()})
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
    program = make_fused_iterations(
        run.policy, learner.optimizer, learner.loss, learner.prepare,
        group_size=section.group_size,
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
    warning = kl_warning(section)
    if warning:
        print(f"[grpo_jax] warning: {stage.name}.{warning}", flush=True)
    if section.fused_steps:
        return run_fused(run, stage)
    rl_loop(run, stage, GRPOLearner(run, stage),
            sampling=section_sampling(run, section, temperature=section.temperature),
            dynamic=settings(section)[1].dynamic_sampling)


KIND = StageKind("rl", run_rl, default_section, validate, rl_curves=True,
                 description="GRPO family: " + ", ".join(ALGORITHMS), summary=summary,
                 lora=True)
