"""Stage kind "distill" (DeepSeek-R1, https://arxiv.org/abs/2501.12948, sec. 2.4): a teacher
(the run's current policy, or another finished run's final policy) samples; verified traces
are kept; a student of another named size, fresh or pretrained (`student_init_from`: the
final policy of a finished run of that size, as R1 distils into pretrained Qwen and Llama
models), is fine-tuned on them and becomes the run's model for every later stage (and on
resume: `Run.replace_model`)."""

from __future__ import annotations

import os

import ml_collections

from grpo_jax.models import available_models
from grpo_jax.runner import StageKind
from grpo_jax.runner.supervised import (VERIFIED_GROUPS, sample_verified, stage_rows,
                                        train_on_rows, validate_verified_sampling,
                                        verified_sampling_fields)
from grpo_jax.training import Policy


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "distill" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "distill"
    verified_sampling_fields(s)
    s.teacher = ""  # "": the run's current params | a finished grpo_jax run's workdir
    s.student_model = "tiny-1m"  # grpo_jax.models.named_config name of the student
    # "": a fresh student | a finished grpo_jax run's workdir whose final policy (of size
    # student_model, e.g. a pretrain-only run) is the student before fine-tuning
    s.student_init_from = ""
    return s


def validate(check) -> None:
    validate_verified_sampling(check)
    check.choice("student_model", available_models())
    teacher = check.string("teacher")
    if teacher and not os.path.isfile(os.path.join(teacher, "config.json")):
        check.fail("teacher", f"{teacher!r} is not a grpo_jax workdir (no config.json); use "
                              "'' for the run's current params")
    student = check.string("student_init_from")
    if student and not os.path.isdir(os.path.join(student, "checkpoints")):
        check.fail("student_init_from", f"{student!r} is not a finished grpo_jax run "
                                        "(no checkpoints/); use '' for a fresh student")


def load_teacher(run, workdir: str):
    """(Policy, params) of another grpo_jax run's final policy (same tokenizer): its latest
    checkpoint that ended a stage, of the shape its own config.json (or a distilled model's
    name in the checkpoint meta) gives, a LoRA run's adapters merged onto its base
    (`model_init.load_run_policy`)."""
    from grpo_jax.runner.model_init import load_run_policy  # pylint: disable=import-outside-toplevel

    return Policy.from_model(load_run_policy(workdir, tokenizer=run.tokenizer)[1])


def run_distill(run, stage) -> None:
    section = stage.section

    def sample():
        if section.teacher:
            policy, params = load_teacher(run, section.teacher)
        else:
            policy, params = run.policy, run.params
        return sample_verified(run, stage, policy, params,
                               seed=run.stage_seed(stage.name, "problems"))

    rows = stage_rows(run, stage, sample)
    # The student is the run's model from here on.
    run.replace_model(section.student_model, seed=run.stage_seed(stage.name, "init"))
    if section.student_init_from and stage.resume_meta is None:
        run.params = pretrained_student(run, section)
    train_on_rows(run, stage, *rows)


def pretrained_student(run, section):
    """The final parameters of run `section.student_init_from`, placed like `run.params` (a
    ConfigError naming the field when that run's model is not of size student_model)."""
    import jax  # pylint: disable=import-outside-toplevel

    from grpo_jax.runner import ConfigError  # pylint: disable=import-outside-toplevel
    from grpo_jax.runner.model_init import load_run_policy  # pylint: disable=import-outside-toplevel

    _, model, _, _ = load_run_policy(section.student_init_from, tokenizer=run.tokenizer)
    _, loaded = Policy.from_model(model)
    shape = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), tree)
    if shape(loaded) != shape(run.params):
        raise ConfigError(
            f"distill.student_init_from: {section.student_init_from!r} holds a model of "
            f"another shape than student_model {section.student_model!r} (with this run's "
            "tokenizer); name that run's model size in student_model")
    return jax.tree.map(lambda x, ref: jax.device_put(x, ref.sharding), loaded, run.params)


KIND = StageKind("distill", run_distill, default_section, validate,
                 description="distillation of verified teacher traces into a fresh student",
                 groups=VERIFIED_GROUPS)
