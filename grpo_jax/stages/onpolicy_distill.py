"""Stage kind "onpolicy_distill": on-policy distillation (Agarwal et al. 2024, "On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes", arXiv:2306.13649:
GKD with the student's own samples and the reverse KL), in the shared RL loop.

Each iteration the student (the run's policy) samples completions of the stage's prompts; at
every completion token t of those samples the loss is the reverse KL of the student's
next-token distribution to a teacher's,

    KL_t = sum_v pi_s(v | x, y_<t) (log pi_s(v | x, y_<t) - log pi_teacher(v | x, y_<t)),

averaged over the completion tokens of the batch. Its gradient flows through pi_s at each
position, not through the sampling (the samples are data, as in GKD). The teacher is another
finished grpo_jax run's final policy (`teacher`), of any size with the run's tokenizer; it is
frozen and kept in the stage's state (so a resume restores it with the student). The
stage's rewards are scored and logged (reward_mean, pass rates), not trained on.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax import losses
from grpo_jax.rl.update import logp_mismatch
from grpo_jax.runner import Learner, StageKind, rl_loop
from grpo_jax.runner.fields import LOOP, SAMPLING, declare
from grpo_jax.runner.rl_loop import LoopSettings
from grpo_jax.runner.sources import HostSource
from grpo_jax.runner.toolkit import stage_optimizer
from grpo_jax.runner.model_init import load_run_policy
from grpo_jax.training import Policy, init_opt_state, optimizer_step

GROUPS = (LOOP, SAMPLING)  # the shared field groups of an onpolicy_distill section


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "onpolicy_distill" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "onpolicy_distill"
    declare(s, *GROUPS)  # steps, num_prompts, group_size, rewards, ..., top_p (runner.fields)
    s.teacher = ""  # a finished grpo_jax run's workdir: its final policy is the teacher
    s.lr = 2e-4  # peak learning rate of the student
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    return s


def validate(check) -> None:
    teacher = check.string("teacher")
    if not teacher:
        check.fail("teacher", "expected a finished grpo_jax run's workdir (its final policy "
                              "is the teacher)")
    if not os.path.isfile(os.path.join(teacher, "config.json")) or \
            not os.path.isdir(os.path.join(teacher, "checkpoints")):
        check.fail("teacher", f"{teacher!r} is not a finished grpo_jax run (config.json and "
                              "checkpoints/)")
    check.positive("lr")
    rows = check.section.num_prompts * check.section.group_size
    check.divides("micro_batches", rows, what=f"rollout batch N*G = {rows}")


def completion_logits(policy, params, batch, prompt_len: int):
    """[B, N, V] float32 logits of each completion token's prediction (the position before
    it), teacher-forced over the batch's [prompt | completion] rows."""
    logits = policy.bind(params)(batch.tokens, attention_mask=batch.attention_mask)
    return logits[:, prompt_len - 1:-1].astype(jnp.float32)


def distill_loss(params, batch, *, student, teacher, teacher_params, prompt_len: int,
                 num_tokens):
    """(the loss: the reverse KL(pi_s || pi_teacher) summed over the batch's loss-mask tokens
    over `num_tokens`, metrics). The teacher's logits carry no gradient."""
    mask = batch.loss_mask
    logits = completion_logits(student, params, batch, prompt_len)
    teacher_logits = jax.lax.stop_gradient(
        completion_logits(teacher, teacher_params, batch, prompt_len))
    kl = losses.full_kl(logits, teacher_logits)
    weights = mask.astype(jnp.float32)
    loss = jnp.sum(kl * weights) / num_tokens
    logp_all = jax.nn.log_softmax(logits, -1)
    logp = jnp.take_along_axis(logp_all, batch.tokens[:, prompt_len:, None], -1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
    metrics = {"loss": loss, "reverse_kl": loss,
               "entropy": jnp.sum(jax.lax.stop_gradient(entropy) * weights) / num_tokens}
    metrics.update(logp_mismatch(jax.lax.stop_gradient(logp), batch.behaviour_logp, mask,
                                 num_tokens=num_tokens))
    return loss, metrics


class OnPolicyDistillLearner(Learner):
    """One optimizer step of the student per batch on the reverse KL to the frozen teacher;
    the state holds the student's parameters, its optimizer state and the teacher's
    parameters."""

    def __init__(self, run, stage):
        section = stage.section
        self.run, self.section = run, section
        # another run's final policy, of the shape its own config gives (any size)
        self.teacher, teacher_params = Policy.from_model(
            load_run_policy(section.teacher, tokenizer=run.tokenizer)[1])
        self.optimizer, self.schedule = stage_optimizer(run, lr=section.lr, steps=section.steps)
        self.state = {"params": run.params,
                      "opt_state": init_opt_state(self.optimizer, run.params, run.mesh),
                      "teacher_params": teacher_params}
        self.prompt_len = run.config.task.prompt_len

    def iteration(self, state, batch):
        num_tokens = jnp.maximum(jnp.sum(batch.loss_mask.astype(jnp.float32)), 1.0)
        loss_fn = functools.partial(distill_loss, student=self.run.policy,
                                    teacher=self.teacher,
                                    teacher_params=state["teacher_params"],
                                    prompt_len=self.prompt_len, num_tokens=num_tokens)
        params, opt_state, metrics = optimizer_step(
            loss_fn, self.optimizer, state["params"], state["opt_state"], batch,
            micro_batches=self.section.micro_batches)
        return {**state, "params": params, "opt_state": opt_state}, metrics

    def learning_rate(self, step):
        return float(self.schedule(step))


def run_onpolicy_distill(run, stage) -> None:
    rl_loop(run, stage, OnPolicyDistillLearner(run, stage),
            HostSource(run, stage, LoopSettings.of(stage.section, GROUPS)))


KIND = StageKind("onpolicy_distill", run_onpolicy_distill, default_section, validate,
                 rl_curves=True,
                 description="on-policy distillation: the reverse KL to a teacher's "
                             "next-token distributions on the student's own samples",
                 groups=GROUPS)

__all__ = ["KIND", "OnPolicyDistillLearner", "completion_logits", "distill_loss"]
