"""Field groups: config fields that several stage kinds share, each group declared once with
its defaults, its comments and its checks.

A stage kind lists the groups its section has (`StageKind.groups`); its `default_section`
declares them (`declare`) and may then set kind-specific defaults, and validation runs each
group's checks before the kind's own (`runner.validation`). What reads a group's fields
(the RL loop's `LoopSettings`, `rollouts.tool_episodes`) reads them as typed values, never by
probing the section for them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from grpo_jax.rl.update import CORRECTIONS
from grpo_jax.tools import ENVIRONMENTS, environment_name_error, make_environment


@dataclasses.dataclass(frozen=True)
class FieldGroup:
    """A named set of section fields.

    Attributes:
      name: the group's name (for docs and errors).
      add: add(section) sets the group's fields to their defaults (commented there).
      check: check(check: SectionCheck) checks them; ConfigError lines name the field.
    """

    name: str
    add: Callable[[ml_collections.ConfigDict], None]
    check: Callable[[object], None]

    @property
    def fields(self) -> tuple[str, ...]:
        section = ml_collections.ConfigDict()
        self.add(section)
        return tuple(section.keys())

    def values(self, section) -> dict:
        """The group's fields of `section` (which has the group)."""
        return {field: section[field] for field in self.fields}


def declare(section: ml_collections.ConfigDict, *groups: FieldGroup) -> ml_collections.ConfigDict:
    """Adds every group's fields with their defaults to `section`; returns it."""
    for group in groups:
        group.add(section)
    return section


def _add_loop(s) -> None:
    s.steps = 80  # RL iterations (sample -> score -> update)
    s.num_prompts = 32  # N prompts per iteration
    s.group_size = 8  # G completions per prompt
    # Reward name -> weight. Names: the task's (accuracy, format, format_soft, ...), built-ins
    # (language, overlong) and stage-kind sources (reward_model, with reward_model set).
    s.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    s.reward_model = ""  # reward_model stage name (or directory) for the "reward_model" reward
    s.checkpoint_every = 20  # steps between checkpoints (0 = only at the end)
    s.overlong_cache = 0  # soft overlong punishment ramp L_cache (tokens); 0 = off


def _check_loop(check) -> None:
    for field in ("steps", "num_prompts", "group_size"):
        check.integer(field)
    check.rewards()
    check.integer("checkpoint_every", low=0)
    check.integer("overlong_cache", low=0, high=check.fits_context("max_new_tokens"))


# The RL loop's fields (`runner.rl_loop`): iterations, batch, rewards, checkpoints.
LOOP = FieldGroup("loop", _add_loop, _check_loop)


def _at_most_rows(check, field: str, why: str) -> int:
    """A count of rows in [0, N*G] (the rollout batch: the loop group's num_prompts x
    group_size, checked first); beyond it `why` gains nothing and allocates for rows that
    do not exist (pack_blocks = 1000000 asked for terabytes)."""
    value = check.integer(field, low=0)
    prompts, group = check.section.num_prompts, check.section.group_size
    if value > prompts * group:
        check.fail(field, f"expected a value in [0, {prompts * group}] (the rollout batch "
                          f"N*G = {prompts} x {group} rows; {why} gains nothing), got {value}")
    return value


def _add_sampling(s) -> None:
    s.top_k = 0  # 0 = off
    s.top_p = 1.0  # nucleus sampling; 1 = off
    s.max_new_tokens = 40  # completion budget (an episode's whole budget with tools)
    # Continuous batching (`sampling.decode`, `DecodeSpec.continuous`): the rollout's rows
    # are sampled this many at a time, a slot taking the next row when its row ends, so the
    # batch does not wait for its longest row; single-turn, the same samples as 0 (every row
    # at once); with tools, a slot whose row waits for its answer keeps it, and the episodes
    # carry no holes.
    s.slots = 0


def _check_sampling(check) -> None:
    check.integer("top_k", low=0)
    check.number("top_p", low=0.0, high=1.0, low_open=True)
    check.fits_context("max_new_tokens")
    _at_most_rows(check, "slots", "sampling more rows at a time than there are")


# How the RL loop samples its rollouts (`LoopSettings.sampling`).
SAMPLING = FieldGroup("sampling", _add_sampling, _check_sampling)


def _add_off_policy(s) -> None:
    # Off-policy rollouts: K > 0 samples the rollouts that update t trains on with the
    # parameters of update t - K (the first K + 1 batches with the stage's initial ones), a
    # pipelined schedule whose pending rollouts are checkpointed with the stage. The update
    # then corrects with off_policy_correction: none (ratio against the sampler's
    # log-probs) | tis (truncated importance weights, cap is_cap) | mis (tokens whose weight
    # leaves [mis_low, mis_high] dropped) | decoupled (AReaL's; rl.update.off_policy_weights)
    s.max_staleness = 0
    s.off_policy_correction = "tis"
    s.is_cap = 2.0
    s.mis_low = 0.5
    s.mis_high = 2.0
    # Partial rollouts (Kimi k1.5; `runner.partial`): > 0 decodes each unfinished row at
    # most this many tokens per update; a row not finished is carried into the next update
    # and continued with the newer parameters, every token keeping its log-prob and
    # version (the correction above applies per token). A group trains when its rows are
    # all done (the batch's other groups are masked fillers), and a row is decoded to its
    # end in the update its group's first token would otherwise pass max_staleness
    # (>= 1). 0 = off: every row is sampled whole by the update it trains.
    s.partial_tokens = 0


def _check_off_policy(check) -> None:
    steps = check.section.get("steps")
    # the queue holds K + 1 rollouts; a K past the stage's last update samples nothing used
    check.integer("max_staleness", low=0,
                  high=max(steps - 1, 0) if isinstance(steps, int) and steps > 0 else None)
    check.choice("off_policy_correction", CORRECTIONS)
    check.positive("is_cap")
    low, high = check.number("mis_low", low=0.0), check.number("mis_high")
    if not low < 1.0 < high:
        check.fail("mis_high", f"MIS keeps weights in [mis_low, mis_high] around 1: "
                               f"expected mis_low < 1 < mis_high, got [{low}, {high}]")
    budget = check.section.get("max_new_tokens")
    # what partial rollouts cannot do is their source's check (`PartialSource.check`, run
    # by the kind's validate with its settings)
    check.integer("partial_tokens", low=0,
                  high=budget - 1 if isinstance(budget, int) and budget > 1 else None)


# Stale rollouts (the host source's queue) and their correction in the learner.
OFF_POLICY = FieldGroup("off_policy", _add_off_policy, _check_off_policy)


def _add_tools(s) -> None:
    # A tool or environment name turns on multi-turn episodes (grpo_jax.tools: the tools
    # calc and python, "json:python,calc" for tools called as JSON in the checkpoint's
    # format ("json:guess,python": with the guessing game as a tool with state), the
    # stateful environments guess and guess_blind, "openenv:URL,tag=..." an OpenEnv
    # server's environment, grpo_jax.tools.openenv): a turn ends when
    # the policy closes its action (<calc>12*34</calc>), the answer (<result>408</result>)
    # is appended to the context, attended to but never trained on, and the policy goes on
    # from its KV cache. A stateful environment may end the episode and gives rewards (the
    # reward name "environment"). max_new_tokens bounds the whole episode (generated and
    # observation tokens). "" = single-turn sampling.
    s.tools = ""
    s.max_turns = 4  # the most tool answers an episode gets
    s.max_observation_tokens = 24  # an answer's width in tokens (a longer one is cut)
    # The most slots a row that closed its call waits before the loop stops for the host to
    # answer it (its answer is then written beside the rows still generating).
    s.max_wait_tokens = 4


def _check_tools(check) -> None:
    name = check.string("tools") if "tools" in check.section else ""
    problem = environment_name_error(name) if name else None
    if problem:
        check.fail("tools", problem)
    rewards = check.section.get("rewards") or {}
    if "environment" in rewards and not (name and problem is None
                                         and make_environment(name).gives_rewards):
        check.fail("rewards.environment", f"the reward 'environment' is a stateful "
                                          f"environment's own; tools {name!r} gives none "
                                          f"(environments: {sorted(ENVIRONMENTS)}, or "
                                          "'json:' with guess)")
    check.integer("max_turns", low=1 if name else 0)  # with a tool, at least one answer
    check.integer("max_wait_tokens", low=0)
    width = check.integer("max_observation_tokens")
    if name and width >= check.section.max_new_tokens:
        check.fail("max_observation_tokens", f"{width} leaves no room for the policy's "
                                             f"tokens within max_new_tokens "
                                             f"{check.section.max_new_tokens}")


# Multi-turn episodes with a tool (`runner.rollouts.tool_episodes`).
TOOLS = FieldGroup("tools", _add_tools, _check_tools)


def _add_training(s) -> None:
    s.num_iterations = 1  # mu: passes (epochs) over each rollout batch
    s.num_minibatches = 1  # optimizer steps per pass
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.lr = 2e-4  # peak learning rate of the policy
    # > 0: the update runs on the batch's rows packed into this many blocks of P + N tokens
    # (`rl.packing`: the same gradient on fewer positions when completions are uneven); a
    # batch that does not fit runs padded. Host loop, one minibatch, one micro-batch.
    s.pack_blocks = 0


def _check_training(check) -> None:
    for field in ("num_iterations", "num_minibatches", "micro_batches"):
        check.integer(field)
    check.positive("lr")
    if _at_most_rows(check, "pack_blocks", "packing into more blocks than rows"):
        section = check.section
        for field in ("num_minibatches", "micro_batches"):
            if section[field] != 1:
                check.fail("pack_blocks", f"packed updates run one minibatch of one "
                                          f"micro-batch; set {field} = 1 or pack_blocks = 0")
        if section.get("fused_steps", 0):
            check.fail("pack_blocks", "packed updates run in the host loop (rows are packed "
                                      "on the host); set fused_steps = 0 or pack_blocks = 0")
    # How the batch divides (check.minibatches) is the kind's check: it depends on the
    # group size, which the kind checks first.


# The updates of an iteration: mu passes of minibatches (`rl.batch.scan_minibatches`),
# micro-batches and the policy's learning rate.
TRAINING = FieldGroup("training", _add_training, _check_training)



def _add_supervised(s) -> None:
    s.steps = 1500  # optimizer steps
    s.batch_size = 64  # rows per step (divisible by micro_batches x data-parallel devices)
    s.lr = 3e-3  # peak learning rate (warmup + cosine from config.optim)
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.checkpoint_every = 0  # steps between checkpoints (0 = only at the stage's end)
    # Rows of this many tokens holding several examples each (attention and positions kept
    # per example: the same loss on fewer positions); 0 = one example per padded row.
    s.pack_len = 0


def _check_supervised(check) -> None:
    check.integer("steps")
    check.integer("batch_size")
    check.positive("lr")
    check.integer("checkpoint_every", low=0)
    check.divides("batch_size", check.section.batch_size)
    check.pack_len()


# Next-token training on (prompt, completion) rows (`runner.supervised.train_supervised`:
# pretrain, sft, rejection_sft, distill): steps, batch, learning rate, checkpoints, packing.
SUPERVISED = FieldGroup("supervised", _add_supervised, _check_supervised)
