"""Tokenised (prompt, completion) arrays for next-token pretraining and SFT."""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np
from flax import struct

from grpo_jax.text.rows import encode_pair_rows, first_fit


@struct.dataclass
class TokenBatch:
    """Rows for next-token training: every field [B, L], row-major like a RolloutBatch.

    Attributes:
      tokens: int32 token ids, right-padded.
      attention_mask: bool, the tokens the model attends to.
      loss_mask: bool, the tokens whose prediction is trained.
      segment_ids: int32 example index within a packed row (1, 2, ...; 0 at padding), or
        None for one example per row.
      positions: int32 positions restarting at 0 for each packed example, or None.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    segment_ids: jax.Array | None = None
    positions: jax.Array | None = None

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    def take(self, rows) -> "TokenBatch":
        """The rows `rows` (an index array) of every field."""
        return jax.tree.map(lambda x: x[rows], self)


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str],
                 **options) -> TokenBatch:
    """`text.rows.encode_pair_rows` as a TokenBatch of numpy arrays: right-padded [BOS]
    prompt completion [EOS] rows (the layout of a rollout) with their loss masks (the
    spans matching `observations` out of the loss). `options`: its keyword arguments
    (seq_len, max_len, loss_on_prompt, observations)."""
    tokens, attention_mask, loss_mask = encode_pair_rows(tokenizer, prompts, completions,
                                                         **options)
    return TokenBatch(tokens=tokens, attention_mask=attention_mask, loss_mask=loss_mask)


def epoch_batches(num_rows: int, batch_size: int, step: int, *, seed: int) -> np.ndarray:
    """Row indices of batch `step`: a fresh seeded permutation every epoch.

    A pure function of (seed, step), so a resumed run sees exactly the same batches.
    """
    if batch_size > num_rows:
        raise ValueError(f"batch_size {batch_size} exceeds the {num_rows} rows of data")
    per_epoch = num_rows // batch_size
    epoch, index = divmod(step, per_epoch)
    order = _epoch_order(num_rows, seed, epoch)
    return order[index * batch_size : (index + 1) * batch_size].copy()


@functools.lru_cache(maxsize=2)
def _epoch_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded permutation of an epoch (drawn once, not at every step)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_rows)
    order.setflags(write=False)
    return order


def packed_rows_needed(lengths: np.ndarray, length: int) -> int:
    """Rows of `length` tokens that first-fit decreasing packs examples of `lengths` into."""
    return len(first_fit(np.asarray(lengths), length))


def packed_rows_for(lengths: np.ndarray, batches, length: int, *, multiple: int = 1) -> int:
    """One row count for every batch (index arrays into `lengths`): the most rows any of them
    packs into, rounded up to `multiple` (micro-batches x data-parallel devices), so that a
    stage's packed step has one shape."""
    need = max(packed_rows_needed(lengths[rows], length) for rows in batches)
    return -(-need // multiple) * multiple


def pack_rows(batch: TokenBatch, num_rows: int) -> TokenBatch:
    """Several examples per row: `encode_pairs` rows [n, L] packed into [num_rows, L].

    Each example keeps its tokens in order and its loss mask; `segment_ids` (1, 2, ... within
    a row, 0 at padding) keeps attention inside an example and `positions` restart at 0 for
    each, so the model computes exactly what it does for the unpacked rows, on fewer
    positions. Examples are placed first-fit decreasing by length.

    Returns:
      a TokenBatch with segment_ids and positions, every field [num_rows, L].
    """
    tokens, attention_mask = np.asarray(batch.tokens), np.asarray(batch.attention_mask)
    loss_mask = np.asarray(batch.loss_mask)
    n, length = tokens.shape
    lengths = attention_mask.sum(axis=1)
    bins = first_fit(lengths, length)
    if len(bins) > num_rows:
        raise ValueError(f"{n} examples need {len(bins)} packed rows of {length} tokens, "
                         f"more than the {num_rows} allowed")
    padding = tokens[~attention_mask]
    pad_id = padding[0] if padding.size else 0
    out = {
        "tokens": np.full((num_rows, length), pad_id, np.int32),
        "attention_mask": np.zeros((num_rows, length), bool),
        "loss_mask": np.zeros((num_rows, length), bool),
        "segment_ids": np.zeros((num_rows, length), np.int32),
        "positions": np.zeros((num_rows, length), np.int32),
    }
    for row, members in enumerate(bins):
        start = 0
        for segment, i in enumerate(members, start=1):
            end = start + lengths[i]
            out["tokens"][row, start:end] = tokens[i, : lengths[i]]
            out["attention_mask"][row, start:end] = True
            out["loss_mask"][row, start:end] = loss_mask[i, : lengths[i]]
            out["segment_ids"][row, start:end] = segment
            out["positions"][row, start:end] = np.arange(lengths[i])
            start = end
    return TokenBatch(**out)
