"""Rewards computed on device from completion token ids (the fused RL iteration).

The host path decodes every completion to text and calls Python rewards. For a tokenizer
that spells text one character per id, with one id per think/answer tag (the char
tokenizer), the format and accuracy rules can be read off the token ids instead, so that
sampling, scoring, advantages and the update compile into one XLA program
(`grpo_jax.rl.fused`). A device reward is made for a tokenizer:

    fn = make_device_reward(name, tokenizer)
    fn(tokens [B, N] int32, mask [B, N] bool, answers [B] int32) -> [B] float32

`tokens` / `mask` are the sampler's completion ids and mask (the EOS included); `answers`
the reference answers as integers (`integer_answers`).

Built-ins, each the token reading of the host rule of the same name:

* "format": `rewards.format.strict_format_reward`: after stripping whitespace the text is
  `<think>T</think><answer>A</answer>`, each tag exactly once, only whitespace between the
  blocks, A not blank.
* "accuracy": `rewards.accuracy.accuracy_reward` for integer references: the answer between
  the last `</answer>` and the last `<answer>` before it, whitespace removed, is an integer
  literal (optional sign, digits, optionally "." and zeros: "22", "-3", "+022", "7.00", "5.",
  ".0")
  equal to the reference.

Where the two readings can differ (the device reward 0, the host one 1): answers that only
the host's wider number grammar or math-verify accepts ("$22", "2.2e1", "1,234", and
expressions equal to the reference such as "44/2", "--22", "22+", "0-22"), and a tag spelled
out character by character (the char tokenizer encodes a tag in text as its one id, so
training data never spells one). `tests/test_device_rewards.py` checks that the two agree on
every other input of the tag layout.
Register more with `register_device_reward(name)(factory)`, `factory(tokenizer) -> fn`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from grpo_jax.rewards.parsing import ANSWER_CLOSE, ANSWER_OPEN, TAGS, THINK_CLOSE, THINK_OPEN

DeviceReward = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]
_FACTORIES: dict[str, Callable[..., DeviceReward]] = {}
_DIGITS = "0123456789"
_MAX_INT_DIGITS = 9  # references are int32: |answer| < 10**9
_MAX_NUMBER_CHARS = 100  # as rewards.accuracy.MAX_NUMBER_CHARS


def register_device_reward(name: str):
    """Decorator registering `factory(tokenizer) -> fn` as the device reward `name`."""
    def wrap(factory):
        _FACTORIES[name] = factory
        return factory
    return wrap


def device_reward_names() -> list[str]:
    return sorted(_FACTORIES)


class TokenTable:
    """Per-id facts of a character-level tokenizer, as device arrays indexed by id."""

    def __init__(self, tokenizer):
        strings = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
        self.tag_ids = {}
        for tag in TAGS:
            ids = [i for i, s in enumerate(strings) if s == tag]
            if len(ids) != 1:
                raise ValueError(f"device rewards need one token id for the tag {tag!r}; "
                                 f"this tokenizer has {len(ids)}")
            self.tag_ids[tag] = ids[0]
        long = [s for i, s in enumerate(strings) if len(s) > 1 and i not in
                self.tag_ids.values()]
        if long:
            raise ValueError(f"device rewards need a character-level tokenizer (one id per "
                             f"character); this one has multi-character tokens such as "
                             f"{long[0]!r}")
        self.length = jnp.asarray([len(s) for s in strings], jnp.int32)  # 0: pad/bos/eos
        self.space = jnp.asarray([bool(s) and s.isspace() for s in strings])
        self.digit = jnp.asarray([len(s) == 1 and s in _DIGITS for s in strings])
        self.value = jnp.asarray([_DIGITS.index(s) if len(s) == 1 and s in _DIGITS else 0
                                  for s in strings], jnp.int32)
        self.char_id = {s: i for i, s in enumerate(strings) if len(s) == 1}

    def id_of(self, char: str) -> int:
        return self.char_id.get(char, -1)  # -1 never matches a token


def _first(flags):
    """Index of the first True along the last axis (N when there is none)."""
    n = flags.shape[-1]
    return jnp.where(jnp.any(flags, -1), jnp.argmax(flags, -1), n)


def _last(flags):
    """Index of the last True along the last axis (-1 when there is none)."""
    n = flags.shape[-1]
    return jnp.where(jnp.any(flags, -1), n - 1 - jnp.argmax(flags[..., ::-1], -1), -1)


@register_device_reward("format")
def strict_format(tokenizer) -> DeviceReward:
    table = TokenTable(tokenizer)
    ids = table.tag_ids

    def fn(tokens, mask, answers):
        del answers
        text = mask & (table.length[tokens] > 0)
        content = text & ~table.space[tokens]
        pos = jnp.arange(tokens.shape[-1])[None, :]
        is_tag = {tag: text & (tokens == ids[tag]) for tag in TAGS}
        once = jnp.all(jnp.stack([jnp.sum(is_tag[t], -1) == 1 for t in TAGS]), 0)
        first, last = _first(content), _last(content)
        at = lambda i: jnp.take_along_axis(tokens, jnp.clip(i, 0, tokens.shape[-1] - 1)[:, None],
                                           -1)[:, 0]
        starts = at(first) == ids[THINK_OPEN]
        ends = at(last) == ids[ANSWER_CLOSE]
        think_close, answer_open = _first(is_tag[THINK_CLOSE]), _first(is_tag[ANSWER_OPEN])
        between = content & (pos > think_close[:, None]) & (pos < answer_open[:, None])
        answer = content & (pos > answer_open[:, None]) & (pos < last[:, None])
        ok = (once & starts & ends & (think_close < answer_open) & ~jnp.any(between, -1)
              & jnp.any(answer, -1))
        return ok.astype(jnp.float32)

    return fn


@register_device_reward("accuracy")
def integer_accuracy(tokenizer) -> DeviceReward:
    table = TokenTable(tokenizer)
    ids = table.tag_ids
    plus, minus, dot, zero = (table.id_of(c) for c in "+-.0")

    def fn(tokens, mask, answers):
        text = mask & (table.length[tokens] > 0)
        pos = jnp.arange(tokens.shape[-1])[None, :]
        close = _last(text & (tokens == ids[ANSWER_CLOSE]))
        open_ = _last(text & (tokens == ids[ANSWER_OPEN]) & (pos < close[:, None]))
        span = text & (pos > open_[:, None]) & (pos < close[:, None]) & (open_ >= 0)[:, None]
        content = span & ~table.space[tokens]
        # The stripped answer's length in characters (host: longer ones are not numbers).
        lo, hi = _first(content), _last(content)
        inner = span & (pos >= lo[:, None]) & (pos <= hi[:, None])
        chars = jnp.sum(jnp.where(inner, table.length[tokens], 0), -1)
        rank = jnp.cumsum(content, -1) - 1  # position among the answer's characters
        digit = content & table.digit[tokens]
        sign = content & ((tokens == plus) | (tokens == minus)) & (rank == 0)
        is_dot = content & (tokens == dot)
        other = content & ~digit & ~sign & ~is_dot
        dot_at = _first(is_dot)
        integer = digit & (pos < dot_at[:, None])
        fraction = digit & (pos > dot_at[:, None])
        well_formed = (jnp.any(content, -1) & ~jnp.any(other, -1)
                       & (jnp.sum(is_dot, -1) <= 1)
                       & (jnp.any(integer, -1) | jnp.any(fraction, -1))  # "7", "7.", ".0"
                       & ~jnp.any(fraction & (tokens != zero), -1)
                       & (chars <= _MAX_NUMBER_CHARS))
        # Value of the integer part: digit j has place = integer digits after it.
        place = jnp.sum(integer, -1, keepdims=True) - jnp.cumsum(integer, -1)
        digits = jnp.where(integer, table.value[tokens], 0)
        too_big = jnp.any((digits > 0) & (place >= _MAX_INT_DIGITS), -1)
        powers = jnp.asarray([10 ** k for k in range(_MAX_INT_DIGITS)], jnp.int32)
        value = jnp.sum(jnp.where(place < _MAX_INT_DIGITS,
                                  digits * powers[jnp.clip(place, 0, _MAX_INT_DIGITS - 1)], 0),
                        -1)
        negative = jnp.any(sign & (tokens == minus), -1)
        value = jnp.where(negative, -value, value)
        ok = well_formed & ~too_big & (value == answers) & (close >= 0)
        return ok.astype(jnp.float32)

    return fn


def make_device_reward(name: str, tokenizer) -> DeviceReward:
    """The device reward `name` for `tokenizer` (ValueError naming what is missing)."""
    if name not in _FACTORIES:
        raise ValueError(f"no device reward {name!r}; device rewards: {device_reward_names()}")
    return _FACTORIES[name](tokenizer)


def integer_answers(examples: Sequence) -> np.ndarray:
    """The examples' reference answers as int32 (ValueError naming the first that is not an
    integer below 10**9 in magnitude)."""
    out = np.zeros(len(examples), np.int32)
    for row, example in enumerate(examples):
        text = str(getattr(example, "answer", "")).strip()
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or abs(value) >= 10 ** _MAX_INT_DIGITS:
            raise ValueError(f"device rewards need integer answers below 10**9; example "
                             f"{getattr(example, 'id', row)!r} has {text!r}")
        out[row] = value
    return out
