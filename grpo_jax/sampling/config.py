"""Sampling settings (`SamplingConfig`) and the cache phases they imply."""

from __future__ import annotations

import dataclasses

import numpy as np

MIN_PHASE = 16  # new tokens per cache phase at least (each phase is one more compiled loop)


def phase_ends(columns: int, phases: int) -> tuple[int, ...]:
    """Completion columns at which each cache phase ends (the last is `columns`)."""
    length = max(MIN_PHASE, -(-columns // phases))
    return tuple(range(length, columns, length)) + (columns,)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling settings (hashable: a jit static argument; a new value recompiles).

    Attributes:
      max_new_tokens: completion buffer length N.
      temperature: logits are divided by it before sampling (> 0).
      top_k: keep the k most likely tokens; 0 keeps all.
      top_p: keep the smallest set of most likely tokens with mass >= top_p; 1.0 keeps all.
      greedy: take the argmax (temperature/top-k/top-p ignored).
      eos_ids: token ids that end a row (the EOS is kept in the output and in the mask).
      pad_id: written after a row ends.
      min_thinking_tokens: budget forcing (s1, https://arxiv.org/abs/2501.19393): before this
        many thinking tokens the end-of-thinking delimiter and EOS are not allowed. With
        continuation_ids they are replaced by that continuation (e.g. "Wait"); without, they
        are masked out of the sampling distribution.
      max_thinking_tokens: budget forcing: after this many thinking tokens the delimiter is
        forced; 0 disables the maximum.
      end_thinking_ids: the token sequence of the end-of-thinking delimiter (e.g. the ids of
        "</think>"); thinking is the span from the first generated token to the delimiter.
      continuation_ids: ids inserted in place of a premature delimiter/EOS.
      cache_phases: the KV cache grows in up to this many steps of at least 16 new tokens
        (one decode loop per step), so early tokens attend over a short buffer instead of the
        whole prompt + max_new_tokens one; 1 allocates it all at once. Each phase compiles its
        own copy of the decode step. Samples do not depend on it beyond float rounding.
      prompt_group: rows come in contiguous groups of this many sharing one prompt (the G
        completions per prompt of an RL batch): the prefill runs once per group and its
        KV cache is broadcast to the group's rows. 1 prefills every row.
      slots: continuous batching (`sampling.decode`, `DecodeSpec.continuous`): the rows are
        sampled this many at a time, a slot taking the next row when its row ends; 0 (or
        >= the rows): every row at once. The samples are the same either way (to float
        rounding), with budget forcing too; multi-turn episodes take it as well
        (`sampling.episodes`).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    min_thinking_tokens: int = 0
    max_thinking_tokens: int = 0
    end_thinking_ids: tuple[int, ...] = ()
    continuation_ids: tuple[int, ...] = ()
    cache_phases: int = 4
    prompt_group: int = 1
    slots: int = 0

    def __post_init__(self):
        for name in ("eos_ids", "end_thinking_ids", "continuation_ids"):
            value = getattr(self, name)
            if isinstance(value, (int, np.integer)):
                value = (value,)
            object.__setattr__(self, name, tuple(int(v) for v in value))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(
                f"SamplingConfig.max_new_tokens must be a positive int, got {self.max_new_tokens!r}"
            )
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"SamplingConfig.temperature must be > 0, got {self.temperature!r}")
        if not isinstance(self.cache_phases, int) or self.cache_phases < 1:
            raise ValueError(
                f"SamplingConfig.cache_phases must be an int >= 1, got {self.cache_phases!r}"
            )
        if not isinstance(self.prompt_group, int) or self.prompt_group < 1:
            raise ValueError(
                f"SamplingConfig.prompt_group must be an int >= 1, got {self.prompt_group!r}"
            )
        if not isinstance(self.slots, int) or self.slots < 0:
            raise ValueError(f"SamplingConfig.slots must be an int >= 0, got {self.slots!r}")
        if self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if self.min_thinking_tokens < 0 or self.max_thinking_tokens < 0:
            raise ValueError("SamplingConfig.min_thinking_tokens/max_thinking_tokens must be >= 0")
        if (self.min_thinking_tokens or self.max_thinking_tokens) and not self.end_thinking_ids:
            raise ValueError(
                "SamplingConfig budget forcing needs end_thinking_ids (the delimiter ids)"
            )
        if self.max_thinking_tokens and self.min_thinking_tokens > self.max_thinking_tokens:
            raise ValueError(
                f"SamplingConfig.min_thinking_tokens={self.min_thinking_tokens} exceeds "
                f"max_thinking_tokens={self.max_thinking_tokens}"
            )

    @property
    def phase_ends(self) -> tuple[int, ...]:
        """Completion columns at which each decode phase ends (the last is max_new_tokens)."""
        return phase_ends(self.max_new_tokens, self.cache_phases)

    @property
    def budget_forcing(self) -> bool:
        return bool(self.end_thinking_ids) and bool(
            self.min_thinking_tokens or self.max_thinking_tokens
        )
