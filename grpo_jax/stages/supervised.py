"""Stage kinds "pretrain" (next-token training on noisy worked solutions) and "sft"
(completion-only fine-tuning on worked solutions: the R1 cold start)."""

from __future__ import annotations

import ml_collections
import numpy as np

from grpo_jax.runner import StageKind, train_supervised
from grpo_jax.runner.toolkit import prompt_text


def _training_fields(s: ml_collections.ConfigDict, *, steps: int, lr: float) -> None:
    s.steps = steps  # optimizer steps
    s.batch_size = 64  # rows per step (divisible by micro_batches x data-parallel devices)
    s.lr = lr  # peak learning rate (warmup + cosine from config.optim)
    s.micro_batches = 1  # gradient accumulation inside one optimizer step
    s.checkpoint_every = 0  # steps between checkpoints (0 = only at the stage's end)
    # Rows of this many tokens holding several examples each (attention and positions kept
    # per example: the same loss on fewer positions); 0 = one example per padded row.
    s.pack_len = 0


def default_pretrain_section() -> ml_collections.ConfigDict:
    """Config section of a "pretrain" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "pretrain"
    _training_fields(s, steps=1500, lr=3e-3)
    s.corpus_size = 0  # distinct noisy solutions to train on; 0 = steps x batch_size
    return s


def default_sft_section() -> ml_collections.ConfigDict:
    """Config section of an "sft" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "sft"
    _training_fields(s, steps=1500, lr=3e-3)
    s.num_examples = 2048  # worked solutions of training problems
    s.error_rate = 0.0  # chance that a solution step is wrong (0 = clean solutions)
    return s


def validate(check) -> None:
    check.integer("steps")
    check.integer("batch_size")
    check.positive("lr")
    check.integer("checkpoint_every", low=0)
    check.divides("batch_size", check.section.batch_size)
    check.pack_len()
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
                     lora=True)
SFT = StageKind("sft", run_sft, default_sft_section, validate,
                description="completion-only SFT on worked solutions (cold start)", lora=True)
