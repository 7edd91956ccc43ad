"""Tokenised (prompt, completion) rows: the layout SFT, pretraining and the reward model share.

A row is [BOS] prompt completion [EOS], right-padded, the layout of a rollout (BOS, prompt,
then the completion ending in EOS), so the positions a model sees in SFT, in reward-model
training and in RL agree.
"""

from __future__ import annotations

import re

from typing import Sequence

import numpy as np

from grpo_jax.text import prompt_ids as prompt_ids_of


def encode_pair_rows(
    tokenizer,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    seq_len: int | None = None,
    max_len: int | None = None,
    loss_on_prompt: bool = False,
    observations: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded [BOS] prompt completion [EOS] rows with their loss masks.

    Args:
      tokenizer: a grpo_jax.text tokenizer.
      prompts: n prompt strings (already templated).
      completions: n completion strings.
      seq_len: row length L; a longer row is an error naming the row. None: the longest
        row rounded up to a multiple of 8 (fewer padded positions to compute).
      max_len: with seq_len None, the longest row allowed (the model's context).
      loss_on_prompt: next-token pretraining (loss on every token after BOS) instead of
        SFT's completion-only loss.
      observations: a regular expression of the spans of a completion an environment
        writes (a tool's answer, `Task.observations`): each is encoded on its own, as an
        episode writes it, attended to and out of the loss, as in RL. None: no spans.
    Returns:
      (tokens int32 [n, L], attention_mask bool [n, L], loss_mask bool [n, L]) numpy
      arrays; loss_mask[t] marks the tokens whose prediction is trained.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    n = len(prompts)
    encoded, observed = [], []
    pattern = re.compile(observations, re.S) if observations else None
    for prompt, completion in zip(prompts, completions):
        prompt_ids = prompt_ids_of(tokenizer, prompt)
        completion_ids, outside = [], []
        start = 0
        for match in (pattern.finditer(completion) if pattern else ()):
            for text, policy in ((completion[start:match.start()], True),
                                 (match.group(0), False)):
                ids = tokenizer.encode(text) if text else []
                completion_ids += ids
                outside += [not policy] * len(ids)
            start = match.end()
        ids = [*tokenizer.encode(completion[start:]), tokenizer.eos_id]
        completion_ids += ids
        outside += [False] * len(ids)
        encoded.append((prompt_ids, completion_ids))
        observed.append(outside)
    if seq_len is None:
        longest = max((len(p) + len(c) for p, c in encoded), default=1)
        seq_len = -(-longest // 8) * 8
        if max_len is not None:
            seq_len = min(seq_len, max_len)
    tokens = np.full((n, seq_len), tokenizer.pad_id, np.int32)
    attention_mask = np.zeros((n, seq_len), bool)
    loss_mask = np.zeros((n, seq_len), bool)
    for row, (prompt_ids, completion_ids) in enumerate(encoded):
        ids = prompt_ids + completion_ids
        if len(ids) > seq_len:
            raise ValueError(
                f"row {row}: {len(ids)} tokens exceed the sequence length {seq_len} "
                f"(prompt {len(prompt_ids)}, completion {len(completion_ids)})"
            )
        tokens[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = True
        start = 1 if loss_on_prompt else len(prompt_ids)
        loss_mask[row, start : len(ids)] = True
        loss_mask[row, len(prompt_ids): len(ids)] &= ~np.asarray(observed[row], bool)
    return tokens, attention_mask, loss_mask


def first_fit(lengths: np.ndarray, length: int) -> list[list[int]]:
    """First-fit decreasing: indices of `lengths` grouped into bins of `length` tokens (packed
    SFT rows, packed RL updates); ValueError when one item is longer than a bin."""
    if len(lengths) and lengths.max() > length:
        raise ValueError(f"an example of {lengths.max()} tokens does not fit a packed row of "
                         f"{length}")
    order = np.argsort(-lengths, kind="stable")
    bins: list[list[int]] = []
    free = np.zeros(len(lengths), np.int64)  # at most one bin per item
    for i in order:
        fits = np.flatnonzero(free[: len(bins)] >= lengths[i])
        if fits.size:
            b = int(fits[0])
        else:
            b = len(bins)
            bins.append([])
            free[b] = length
        bins[b].append(int(i))
        free[b] -= lengths[i]
    return bins
