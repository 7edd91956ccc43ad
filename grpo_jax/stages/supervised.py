"""Stage kinds "pretrain" (next-token training on noisy worked solutions) and "sft"
(completion-only fine-tuning on worked solutions: the R1 cold start)."""

from __future__ import annotations

import ml_collections
import numpy as np

from grpo_jax.runner import StageKind, train_supervised
from grpo_jax.runner.fields import SUPERVISED, declare
from grpo_jax.runner.toolkit import prompt_text


GROUPS = (SUPERVISED,)  # a pretrain or sft section's field groups


def default_pretrain_section() -> ml_collections.ConfigDict:
    """Config section of a "pretrain" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "pretrain"
    declare(s, *GROUPS)  # steps, batch_size, lr, micro_batches, checkpoint_every, pack_len
    s.corpus_size = 0  # distinct noisy solutions to train on; 0 = steps x batch_size
    return s


def default_sft_section() -> ml_collections.ConfigDict:
    """Config section of an "sft" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "sft"
    declare(s, *GROUPS)  # steps, batch_size, lr, micro_batches, checkpoint_every, pack_len
    s.num_examples = 2048  # worked solutions of training problems
    s.error_rate = 0.0  # chance that a solution step is wrong (0 = clean solutions)
    return s


def validate(check) -> None:
    """The kind's own fields (the supervised group's are checked before)."""
    if check.section.kind == "pretrain":
        check.integer("corpus_size", low=0)
    else:
        check.integer("num_examples")
        check.number("error_rate", low=0.0, high=1.0)


def pretraining_corpus(run, num_rows: int, *, seed: int):
    """Noisy worked solutions of training problems: (prompts, completions)."""
    task, cfg = run.task, run.config.task
    examples = task.examples("train", num_rows, seed=seed)
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for ex in examples:
        completion, _ = task.solution(ex, rng=rng, error_rate=cfg.solution_error_rate,
                                      format_error_rate=cfg.format_error_rate)
        prompts.append(prompt_text(run, ex))
        completions.append(completion)
    return prompts, completions


def run_pretrain(run, stage) -> None:
    """Next-token pretraining on noisy worked solutions (loss on every token)."""
    section = stage.section
    rows = section.corpus_size or section.steps * section.batch_size
    prompts, completions = pretraining_corpus(run, rows,
                                              seed=run.stage_seed(stage.name, "corpus"))
    train_supervised(run, stage, prompts, completions, loss_on_prompt=True)


def run_sft(run, stage) -> None:
    """SFT on worked solutions with a completion-only loss (cold start)."""
    section, task = stage.section, run.task
    examples = task.examples("train", section.num_examples,
                             seed=run.stage_seed(stage.name, "problems"))
    rng = np.random.default_rng(run.stage_seed(stage.name, "solutions"))
    prompts, completions = [], []
    for ex in examples:
        completion, _ = task.solution(ex, rng=rng, error_rate=section.error_rate,
                                      format_error_rate=0.0)
        prompts.append(prompt_text(run, ex))
        completions.append(completion)
    train_supervised(run, stage, prompts, completions, loss_on_prompt=False)


PRETRAIN = StageKind("pretrain", run_pretrain, default_pretrain_section, validate,
                     description="next-token pretraining on noisy worked solutions",
                     lora=True, groups=GROUPS)
SFT = StageKind("sft", run_sft, default_sft_section, validate,
                description="completion-only SFT on worked solutions (cold start)", lora=True,
                groups=GROUPS)
