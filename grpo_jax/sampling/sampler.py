"""Single-turn sampling: `generate` runs the decode core (`sampling.decode`) without pauses,
prefill and every cache phase in one device call."""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.sampling import decode
from grpo_jax.sampling.config import SamplingConfig
from grpo_jax.sampling.decode import DecodeSpec


@flax.struct.dataclass
class SampleOutput:
    """Completions of one `generate` call.

    Attributes:
      tokens: [B, N] int32, pad_id after EOS (EOS included).
      logp: [B, N] float32 log-probability of each token under the sampling distribution
        (temperature, top-k, top-p and budget-forcing masks applied); for greedy decoding and
        for forced tokens, under the temperature-scaled model distribution. 0 where masked.
      mask: [B, N] bool, True for generated tokens up to and including EOS.
      lengths: [B] int32 = mask.sum(-1).
      forced: [B, N] bool, True where budget forcing inserted the token.
    """

    tokens: jax.Array
    logp: jax.Array
    mask: jax.Array
    lengths: jax.Array
    forced: jax.Array


def _generate_core(graphdef, state, prompts, prompt_mask, key, config: SamplingConfig):
    model = nnx.merge(graphdef, decode.rollout_state(graphdef, state))
    if 0 < config.slots < prompts.shape[0]:  # continuous batching
        spec = DecodeSpec(sampling=config, columns=config.max_new_tokens, continuous=True)
        s = decode.start_slots(model, prompts, prompt_mask, spec, config.slots)
        for phase, end in enumerate(spec.phase_ends):
            if phase:
                s = decode.grow(model, s, prompts.shape[1] + end)
            s = decode.run(model, s, key, spec, end)
    else:
        spec = DecodeSpec(sampling=config, columns=config.max_new_tokens)
        s = decode.prefill(model, prompts, prompt_mask, key, spec)
        for phase, end in enumerate(spec.phase_ends):
            if phase:
                s = decode.grow(model, s, prompts.shape[1] + end)
            s = decode.run(model, s, key, spec, end)
    return SampleOutput(tokens=s.tokens, logp=s.logp, mask=s.generated,
                        lengths=s.generated.sum(-1).astype(jnp.int32), forced=s.forced)


_generate_jit = jax.jit(_generate_core, static_argnames=("graphdef", "config"))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def generate(graphdef, state, prompts, prompt_mask, key, *, config: SamplingConfig) -> SampleOutput:
    """Samples completions for a left-padded prompt batch (compiled once per shape and config).

    One device call of the decode core (`sampling.decode`) without pauses: the prefill (once
    per prompt group), then `config.cache_phases` runs of its loop over a growing KV cache,
    each until its phase's last column or every row done; row r chooses column t with the
    key fold_in(fold_in(key, r), t), so a row's completion depends on its key and index and
    the parameters, not on the batch's other rows.

    Args:
      graphdef: from `nnx.split(model)` (static).
      state: the model state from `nnx.split(model)`.
      prompts: [B, P] int32 token ids, left-padded to the bucket P.
      prompt_mask: [B, P] bool, False at padding; each row needs at least one True.
      key: PRNG key; or [B] keys, one per row, row r then choosing column t with
        fold_in(key[r], t) (rows of different requests, each with its own key).
      config: SamplingConfig (static).

    Returns:
      SampleOutput with tokens/logp/mask/forced [B, N] and lengths [B].
    """
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"generate: config must be a SamplingConfig, got {type(config).__name__}")
    prompts, prompt_mask = checked_prompts(prompts, prompt_mask, config.prompt_group, "generate")
    return _generate_jit(graphdef, state, prompts, prompt_mask, key, config=config)


def checked_prompts(prompts, prompt_mask, group: int, where: str):
    """The prompt batch as (int32 [B, P], bool [B, P]) arrays, checked: [B, P] shapes, integer
    ids, whole prompt groups of `group` rows sharing a prompt, no empty row, left padding
    (the values when they are on this host; a traced or multi-process array only by shape).

    Raises:
      ValueError naming `where` and the first bad row.
    """
    prompts = jnp.asarray(prompts) if not isinstance(prompts, jax.Array) else prompts
    prompt_mask = (
        jnp.asarray(prompt_mask) if not isinstance(prompt_mask, jax.Array) else prompt_mask
    )
    if prompts.ndim != 2:
        raise ValueError(f"{where}: prompts must be [B, P], got shape {prompts.shape}")
    if prompt_mask.shape != prompts.shape:
        raise ValueError(
            f"{where}: prompt_mask shape {prompt_mask.shape} != prompts shape {prompts.shape}"
        )
    if not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(f"{where}: prompts must be integer token ids, got {prompts.dtype}")
    if prompts.shape[0] % group:
        raise ValueError(f"{where}: config.prompt_group {group} does not divide the batch of "
                         f"{prompts.shape[0]} prompts")
    # (a global array of a multi-controller run is checked by each process on its rows)
    if group > 1 and _is_concrete(prompts) and getattr(prompts, "is_fully_addressable", True):
        check_prompt_groups(prompts, prompt_mask, group)
    if _is_concrete(prompt_mask) and getattr(prompt_mask, "is_fully_addressable", True):
        mask = np.asarray(prompt_mask).astype(bool)
        empty = np.flatnonzero(~mask.any(-1))
        if empty.size:
            raise ValueError(
                f"{where}: prompt row {int(empty[0])} is empty (prompt_mask all False)"
            )
        not_left = np.flatnonzero((mask[:, :-1] & ~mask[:, 1:]).any(-1))
        if not_left.size:
            raise ValueError(
                f"{where}: prompt row {int(not_left[0])} is not left-padded "
                "(a padding position follows a real token)"
            )
    return prompts.astype(jnp.int32), prompt_mask.astype(bool)


def check_prompt_groups(prompt_tokens, prompt_mask, group_size: int) -> None:
    """Raises ValueError unless rows g*G .. g*G + G - 1 share their prompt tokens and mask."""
    tokens, mask = np.asarray(prompt_tokens), np.asarray(prompt_mask, bool)
    rows = tokens.shape[0]
    if group_size < 1 or rows % group_size:
        raise ValueError(f"prompt groups: {rows} rows are not whole groups of {group_size}")
    for name, x in (("tokens", tokens), ("mask", mask)):
        grouped = x.reshape(rows // group_size, group_size, -1)
        bad = np.flatnonzero(np.any(grouped != grouped[:, :1], axis=(1, 2)))
        if len(bad):
            g = int(bad[0])
            raise ValueError(f"prompt groups: rows {g * group_size}..{(g + 1) * group_size - 1}"
                             f" should share one prompt but their prompt {name} differ")


def pad_prompts(prompts: Sequence[Sequence[int]], bucket: int, *, pad_id: int = 0):
    """Left-pads token-id lists into a [B, bucket] batch; a prompt longer than bucket is an error.

    Args:
      prompts: B lists of token ids.
      bucket: the padded length P.
      pad_id: id written at padding positions.

    Returns:
      (tokens [B, P] int32 numpy, mask [B, P] bool numpy).
    """
    tokens = np.full((len(prompts), bucket), pad_id, np.int32)
    mask = np.zeros((len(prompts), bucket), bool)
    for row, ids in enumerate(prompts):
        if len(ids) > bucket:
            raise ValueError(
                f"prompt row {row} has {len(ids)} tokens, longer than the bucket of "
                f"{bucket}; use a larger bucket (prompts are never truncated)"
            )
        if len(ids) == 0:
            raise ValueError(f"prompt row {row} is empty")
        tokens[row, bucket - len(ids) :] = ids
        mask[row, bucket - len(ids) :] = True
    return tokens, mask
