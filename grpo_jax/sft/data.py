"""Tokenised (prompt, completion) arrays for next-token pretraining and SFT."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from grpo_jax import text as text_lib


def encode_pairs(
    tokenizer,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    seq_len: int | None = None,
    max_len: int | None = None,
    loss_on_prompt: bool = False,
) -> dict[str, np.ndarray]:
    """Right-padded [BOS] prompt completion [EOS] rows with their loss masks.

    The layout matches a rollout's (BOS, prompt, then completion ending in EOS), so the
    positions a model sees in SFT and in RL agree.

    Args:
      tokenizer: a grpo_jax.text tokenizer.
      prompts: n prompt strings (already templated).
      completions: n completion strings.
      seq_len: row length L; a longer row is an error naming the row. None: the longest
        row rounded up to a multiple of 8 (fewer padded positions to compute).
      max_len: with seq_len None, the longest row allowed (the model's context).
      loss_on_prompt: next-token pretraining (loss on every token after BOS) instead of
        SFT's completion-only loss.
    Returns:
      dict of tokens int32 [n, L], attention_mask bool [n, L], loss_mask bool [n, L]
      (loss_mask[t] marks tokens whose prediction is trained).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    n = len(prompts)
    encoded = []
    for prompt, completion in zip(prompts, completions):
        prompt_ids = text_lib.prompt_ids(tokenizer, prompt)
        completion_ids = [*tokenizer.encode(completion), tokenizer.eos_id]
        encoded.append((prompt_ids, completion_ids))
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
    return {"tokens": tokens, "attention_mask": attention_mask, "loss_mask": loss_mask}


def epoch_batches(num_rows: int, batch_size: int, step: int, *, seed: int) -> np.ndarray:
    """Row indices of batch `step`: a fresh seeded permutation every epoch.

    A pure function of (seed, step), so a resumed run sees exactly the same batches.
    """
    if batch_size > num_rows:
        raise ValueError(f"batch_size {batch_size} exceeds the {num_rows} rows of data")
    per_epoch = num_rows // batch_size
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_rows)
    return order[index * batch_size : (index + 1) * batch_size]
