"""Packed updates: an RL batch's rows packed into fixed token blocks instead of each padded to
the longest.

A padded batch [B, P + N] costs B (P + N) positions in every forward and backward pass of
the update, whatever the rows' lengths; with long-tailed completions most of them are
padding. `pack_rows` places each row's real tokens (its prompt without the left padding,
then its completion) one after another in K blocks of L tokens, first-fit decreasing, with
`segment_ids` (attention stays inside a row) and `positions` (restarting at 0 for each row,
as `default_positions` counts a padded row's real tokens). `PackedRows.index` maps every
completion column of every row to its place in the blocks, so `packed_completion_logprobs`
returns the same [B, N] log-probs (and entropies, and values) as the padded pass: the loss,
the KL, the critic and the metrics read them unchanged, and the gradient equals the padded
update's to float tolerance (tests/test_packing_rl.py).

One difference, on tokens that carry no loss: a padded row scores a token only when the
token before it is real, so the first token after a hole (an episode's answer after its
wait) gets log-prob 0 there and its real log-prob packed. Such a token is the environment's,
never in the loss mask.

Shapes are static: K and L are fixed per compiled update, and a batch whose rows do not fit
K blocks of L tokens is packed into None (the caller runs that step padded).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import logprobs
from grpo_jax.text.rows import first_fit

__all__ = ["PackedRows", "pack_rows", "blocks_needed", "packed_completion_logprobs", "unpack"]


@flax.struct.dataclass
class PackedRows:
    """B rows of a [B, P + N] batch packed into K blocks of L tokens.

    Attributes:
      tokens: [K, L] int32, the rows' real tokens one after another (pad_id after them).
      attention_mask: [K, L] bool, True on the rows' tokens.
      segment_ids: [K, L] int32, 1, 2, ... for the rows of a block (0 on padding).
      positions: [K, L] int32, each token's position within its row (from 0).
      index: [B, N] int32, where completion column j of row b sits in the blocks, as a flat
        index k L + o into [K, L]; -1 where the column holds no token.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    segment_ids: jax.Array
    positions: jax.Array
    index: jax.Array


def blocks_needed(attention_mask, block_len: int) -> int:
    """The blocks of `block_len` tokens that first-fit decreasing packs the rows of
    `attention_mask` [B, T] into."""
    return len(first_fit(np.asarray(attention_mask, bool).sum(axis=1), block_len))


def pack_rows(tokens, attention_mask, prompt_len: int, *, num_blocks: int, block_len: int,
              pad_id: int = 0) -> PackedRows | None:
    """The rows of a padded batch packed into `num_blocks` blocks of `block_len` tokens; None
    when they do not fit (host numpy, before the update's device call).

    Args:
      tokens: [B, P + N] int, prompts left-padded, then completions (a rollout's layout).
      attention_mask: [B, P + N] bool; a row's real tokens are where it is True (holes in an
        episode's completion are dropped, as the padded pass ignores them).
      prompt_len: P.
      num_blocks, block_len: K and L (L >= the longest row).
      pad_id: the token written after the rows.
    """
    tokens = np.asarray(tokens)
    mask = np.asarray(attention_mask, bool)
    if tokens.shape != mask.shape or tokens.ndim != 2:
        raise ValueError(f"pack_rows: tokens and attention_mask must be [B, T] of one shape, "
                         f"got {tokens.shape} and {mask.shape}")
    rows, width = tokens.shape
    if not 0 < prompt_len <= width:
        raise ValueError(f"pack_rows: prompt_len must be in [1, {width}], got {prompt_len}")
    lengths = mask.sum(axis=1)
    if lengths.max(initial=0) > block_len:
        raise ValueError(f"pack_rows: a row of {int(lengths.max())} tokens does not fit a "
                         f"block of {block_len}; raise the block length")
    bins = first_fit(lengths, block_len)
    if len(bins) > num_blocks:
        return None
    out_tokens = np.full((num_blocks, block_len), pad_id, np.int32)
    out_mask = np.zeros((num_blocks, block_len), bool)
    segments = np.zeros((num_blocks, block_len), np.int32)
    positions = np.zeros((num_blocks, block_len), np.int32)
    index = np.full((rows, width - prompt_len), -1, np.int32)
    for block, members in enumerate(bins):
        start = 0
        for segment, row in enumerate(members, start=1):
            real = np.flatnonzero(mask[row])
            end = start + len(real)
            out_tokens[block, start:end] = tokens[row, real]
            out_mask[block, start:end] = True
            segments[block, start:end] = segment
            positions[block, start:end] = np.arange(len(real))
            completion = real >= prompt_len
            index[row, real[completion] - prompt_len] = (
                block * block_len + start + np.flatnonzero(completion))
            start = end
    return PackedRows(tokens=out_tokens, attention_mask=out_mask, segment_ids=segments,
                      positions=positions, index=index)


def unpack(values, index):
    """[K, L] per-token values at the [B, N] places `index` names (0 where it is -1)."""
    flat = values.reshape(-1)
    return jnp.where(index >= 0, flat[jnp.maximum(index, 0)], 0.0)


def packed_completion_logprobs(model, packed: PackedRows, *, temperature: float = 1.0,
                               return_entropy: bool = False, return_values: bool = False,
                               chunk_size=None) -> dict:
    """`models.completion_logprobs` of the padded rows, computed on their packed blocks:
    {"logp": [B, N]} (and "entropy", "values" when asked), 0 where a column holds no token.

    "values" is the critic's V(s_t) before each completion token: the value head on the
    hidden state of the token before it (`rl.ppo.completion_values` on padded rows)."""
    out = logprobs(model, packed.tokens, packed.attention_mask, segment_ids=packed.segment_ids,
                   positions=packed.positions, temperature=temperature,
                   return_entropy=return_entropy, return_values=return_values,
                   chunk_size=chunk_size)
    before = jnp.where(packed.index >= 0, packed.index - 1, -1)  # the token before each
    return {name: unpack(value, before if name == "values" else packed.index)
            for name, value in out.items()}
