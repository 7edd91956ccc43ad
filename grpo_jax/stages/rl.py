"""Stage kind "rl": the GRPO family (every record of `grpo_jax.rl.algorithms.ALGORITHMS`)
in the shared RL loop.

Each iteration: G completions per prompt -> rewards -> the rollout batch -> the
algorithm's reference log-probs and advantages -> mu passes of its objective (+ beta * KL
and the entropy bonus) over minibatches. Nothing here depends on which algorithm runs:
its record says it.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from grpo_jax.models import lora
from grpo_jax.rl.algorithms import ALGORITHMS, AUTO_FIELDS, LOSS_AGGREGATIONS, get_algorithm
from grpo_jax.rl.batch import minibatch_order, scan_minibatches
from grpo_jax.rl.update import (ADVANTAGE_SIGNS, LossSettings, make_prepare_fn,
                                make_train_step)
from grpo_jax.runner import Learner, StageKind, rl_loop
from grpo_jax.runner.fields import LOOP, OFF_POLICY, SAMPLING, TOOLS, TRAINING, declare
from grpo_jax.runner.rl_loop import LoopSettings
from grpo_jax.runner.partial import PartialSource, host_source
from grpo_jax.runner.sources import DeviceSource
from grpo_jax.runner.toolkit import stage_optimizer
from grpo_jax.training import init_opt_state

SWITCH = ("auto", "on", "off")
GROUPS = (LOOP, SAMPLING, OFF_POLICY, TOOLS, TRAINING)  # an rl section's field groups


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "rl" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "rl"
    s.algorithm = "grpo"  # a name in grpo_jax/rl/algorithms.py (ALGORITHMS)
    # steps, num_prompts, group_size, rewards, ..., tools, num_iterations, num_minibatches,
    # micro_batches, lr: the field groups (runner.fields)
    declare(s, *GROUPS)
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
    # The policy gradient on a fraction of the tokens, chosen by the policy's entropy in
    # the update: the highest-entropy `entropy_tokens` of the batch's tokens ("top"; 0.2 is
    # the "forking tokens" of Wang et al. 2025) or the lowest ("bottom"); 1.0 = all.
    s.entropy_tokens = 1.0
    s.entropy_side = "top"
    # The policy gradient on the tokens of one sign of advantage only (Zhu et al. 2025,
    # arXiv:2506.01347): "positive" (positive sample reinforcement: the completions above
    # their group's baseline), "negative" (negative sample reinforcement: those below) or
    # "both" (every token). A zero advantage carries no gradient either way.
    s.advantage_sign = "both"
    s.adv_eps = 1e-6  # std floor in group normalisation
    s.temperature = 1.0  # rollout sampling temperature (the loss uses the same)
    s.ref_reset_every = 0  # replace the reference by the policy every K steps; 0 = never
    # DAPO's switches: "auto" (the algorithm's default: on for dapo) | "on" | "off".
    s.dynamic_sampling = "auto"  # drop zero-variance groups and sample more prompts
    s.max_sampling_rounds = 4  # bound on sampling rounds per step (dynamic sampling)
    s.overlong_filter = "auto"  # truncated completions carry no loss
    # K > 0: each iteration (sample -> device rewards -> advantages -> update) runs on
    # device, K iterations per XLA program (one lax.scan, one host round trip): the
    # DeviceSource (grpo_jax/runner/sources.py), which says what it cannot do. Needs
    # rewards with a device version (grpo_jax/rewards/device.py: accuracy, format) and a
    # character tokenizer; steps and checkpoint_every multiples of K; one update per
    # iteration, no dynamic sampling, overlong ramp, reference reset, stale rollouts or
    # tools. 0 = the HostSource: host rewards, one iteration at a time.
    s.fused_steps = 0
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
    check.integer("max_sampling_rounds")
    g = section.group_size  # an int (the loop group's check)
    if algorithm.needs_groups and g < 2:
        check.fail("group_size", f"{section.algorithm} needs G >= 2 completions per prompt, "
                                 f"got {g}")
    check.minibatches()
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
    check.number("entropy_tokens", low=0.0, high=1.0, low_open=True)
    check.choice("entropy_side", ("top", "bottom"))
    if check.choice("advantage_sign", ADVANTAGE_SIGNS) == "negative" \
            and section.algorithm == "expert_iteration":
        check.fail("advantage_sign", "expert_iteration's advantages are 0 or 1, never "
                                     "negative, so 'negative' would train on nothing; "
                                     "expected both or positive")
    check.positive("adv_eps")
    check.positive("temperature")
    check.integer("ref_reset_every", low=0)
    check.choice("dynamic_sampling", SWITCH)
    check.choice("overlong_filter", SWITCH)
    _, resolved = settings(section)
    if algorithm.objective.token_ratio_only:
        for field, off in (("ratio_level", resolved.ratio_level == "token"),
                           ("dual_clip", section.dual_clip < 0)):
            if not off:
                check.fail(field, f"{section.algorithm} weights each token by its own "
                                  f"clipped ratio; leave {field} on its default")
    if section.partial_tokens:  # the source the run will use checks what it cannot do
        PartialSource.check(check, loop_settings(section))
    if check.integer("fused_steps", low=0):
        DeviceSource.check(check, loop_settings(section))


def loop_settings(section) -> LoopSettings:
    """The loop settings of an rl section: its field groups and its own sampling fields."""
    return LoopSettings.of(section, GROUPS, temperature=section.temperature,
                           dynamic_sampling=settings(section)[1].dynamic_sampling,
                           max_sampling_rounds=section.max_sampling_rounds,
                           fused_steps=section.fused_steps)


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
        entropy_coef=section.entropy_coef,
        token_fraction=float(section.get("entropy_tokens", 1.0)),
        token_side=section.get("entropy_side", "top"),
        advantage_sign=section.get("advantage_sign", "both"))


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
        # A stage that samples ahead (max_staleness > 0) trains on rows of older versions
        # (`step` logs their staleness from batch.version), so its program computes the
        # proximal log-probs and corrects every row (a row of staleness 0 gets ratio 1 up to
        # the sampler's rounding): whether that pass runs is a property of the compiled
        # program, chosen once per stage.
        stale = section.max_staleness > 0
        self.logs_staleness = stale
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
                                          group_size=whole_groups).fn
        self.prepare = make_prepare_fn(run.policy, self.algorithm, self.settings,
                                       prompt_len=prompt_len, temperature=section.temperature,
                                       group_size=section.group_size,
                                       adv_eps=section.adv_eps, on_policy=self.on_policy,
                                       micro_batches=section.micro_batches
                                       * section.num_minibatches,
                                       correction=section.off_policy_correction if stale
                                       else None, is_cap=section.is_cap,
                                       mis_range=(section.mis_low, section.mis_high))

    def iteration(self, state, batch):
        section = self.section
        batch, prep_metrics = self.prepare(state["params"], state.get("ref_params"), batch,
                                           batch.correct, batch.truncated)
        batch = batch.replace(correct=None, truncated=None, token_rewards=None)

        def update(carry, minibatch):
            params, opt_state, metrics = self.train_step(*carry, minibatch)
            return (params, opt_state), metrics

        (params, opt_state), metrics = scan_minibatches(
            update, (state["params"], state["opt_state"]), batch,
            num_iterations=section.num_iterations, num_minibatches=section.num_minibatches)
        # The recomputed log-probs' mismatch is at the rollout's parameters, over the batch.
        metrics = {**metrics, **prep_metrics}
        return {**state, "params": params, "opt_state": opt_state}, metrics

    def host_batch(self, batch, step):
        section, state = self.section, self.state
        if "ref_params" in state and section.ref_reset_every and step > 0 \
                and step % section.ref_reset_every == 0:
            state["ref_params"] = lora.copy_trainable(state["params"])  # DeepSeek-R1
        order = minibatch_order(batch.rows, num_iterations=section.num_iterations,
                                num_minibatches=section.num_minibatches,
                                seed=(self.run.stage_seed(self.stage.name, "minibatches"),
                                      step))
        return batch if order is None else batch.replace(minibatch_order=order)

    def learning_rate(self, step):
        return float(self.schedule(step * self.updates_per_step))


def run_rl(run, stage) -> None:
    warning = kl_warning(stage.section)
    if warning:
        print(f"[grpo_jax] warning: {stage.name}.{warning}", flush=True)
    loop = loop_settings(stage.section)
    learner = GRPOLearner(run, stage)
    source = DeviceSource(run, stage, loop, learner) if loop.fused_steps \
        else host_source(run, stage, loop)
    rl_loop(run, stage, learner, source)


KIND = StageKind("rl", run_rl, default_section, validate, rl_curves=True,
                 description="GRPO family: " + ", ".join(ALGORITHMS), summary=summary,
                 lora=True, groups=GROUPS)
