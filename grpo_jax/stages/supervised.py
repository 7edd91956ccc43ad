"""Stage kinds "pretrain" (next-token training on noisy worked solutions) and "sft"
(completion-only fine-tuning on worked solutions: the R1 cold start)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import ml_collections
import numpy as np

from grpo_jax.runner import StageKind, train_supervised
from grpo_jax.runner.fields import SUPERVISED, declare
from grpo_jax.runner.toolkit import prompt_text
from grpo_jax.text import TAG_TOKENS


GROUPS = (SUPERVISED,)  # a pretrain or sft section's field groups


def default_pretrain_section() -> ml_collections.ConfigDict:
    """Config section of a "pretrain" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "pretrain"
    declare(s, *GROUPS)  # steps, batch_size, lr, micro_batches, checkpoint_every, pack_len
    s.corpus_size = 0  # distinct noisy solutions to train on; 0 = steps x batch_size
    # The share of the corpus's rows that are worked solutions (the first ones); each other
    # row is filler: its own characters (the think / answer tags whole) in a seeded random
    # order, with no prompt (`with_filler`, this module); 1.0 = every row a solution.
    s.solution_fraction = 1.0
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
        check.number("solution_fraction", low=0.0, high=1.0)
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


def shuffled_text(text: str, rng: np.random.Generator, units: Sequence[str] = ()) -> str:
    """`text` with its pieces in a random order (`rng.permutation`): each occurrence of one
    of `units` (e.g. the think / answer tags) is one piece, every other character one
    piece. Under the char tokenizer with `units` its tags, the tokens of `text` permuted."""
    alternatives = [re.escape(u) for u in sorted(units, key=len, reverse=True)] + ["."]
    pieces = re.findall("|".join(alternatives), text, flags=re.S)
    return "".join(pieces[i] for i in rng.permutation(len(pieces)))


def with_filler(prompts: Sequence[str], completions: Sequence[str], solution_fraction: float,
                *, seed: int, units: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """A corpus of (prompt, completion) rows with a share `solution_fraction` of them kept.

    The first k = round(solution_fraction x n) rows (Python's round: halves to even) are
    kept as they are; each row i >= k becomes filler made of its own text: the prompt ""
    and the completion `shuffled_text(prompts[i] + completions[i])` (with `units` and one
    generator seeded with `seed`, drawn row by row). A filler row has the row's pieces
    (the same characters and tags, so under the char tokenizer the same tokens and length)
    and none of its order: no problem statement, no step, no answer in its tags. With
    k = n the rows are returned as they are and nothing is drawn.

    Raises:
      ValueError: solution_fraction outside [0, 1], or prompts and completions of
        different lengths.
    """
    if not 0.0 <= solution_fraction <= 1.0:
        raise ValueError(f"solution_fraction: expected a value in [0, 1], got "
                         f"{solution_fraction!r}")
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    n = len(prompts)
    keep = round(solution_fraction * n)
    prompts, completions = list(prompts), list(completions)
    if keep == n:
        return prompts, completions
    rng = np.random.default_rng(seed)
    for i in range(keep, n):
        prompts[i], completions[i] = "", shuffled_text(prompts[i] + completions[i], rng, units)
    return prompts, completions


def run_pretrain(run, stage) -> None:
    """Next-token pretraining on noisy worked solutions (loss on every token); with
    section.solution_fraction < 1 the corpus's later rows are filler (`with_filler`)."""
    section = stage.section
    rows = section.corpus_size or section.steps * section.batch_size
    prompts, completions = pretraining_corpus(run, rows,
                                              seed=run.stage_seed(stage.name, "corpus"))
    prompts, completions = with_filler(
        prompts, completions, section.get("solution_fraction", 1.0),
        seed=run.stage_seed(stage.name, "filler"),
        units=TAG_TOKENS + tuple(getattr(run.task, "tags", ())))
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
