"""Tokenizers: character level, SentencePiece, Hugging Face tokenizer.json.

Protocol shared by all of them:
    encode(text) -> list[int]   (no bos/eos added)
    decode(ids) -> str          (drops pad/bos/eos)
    vocab_size, pad_id, bos_id (-1: none), eos_id, eos_ids (every id that ends a completion)
    token_to_id(token) -> int | None

`prompt_ids(tokenizer, text)` is how every prompt becomes ids: BOS (when the tokenizer has
one and the text does not already start with it, as chat templates that write it do) and
the text's tokens.
"""

from typing import Iterable, Protocol, runtime_checkable

from grpo_jax.text.char import DEFAULT_ALPHABET, TAG_TOKENS, CharTokenizer
from grpo_jax.text.sentencepiece import SentencePieceTokenizer


@runtime_checkable
class Tokenizer(Protocol):
    """What the samplers, trainers and rewards need from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    eos_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


try:
    from grpo_jax.text.hf import HFTokenizer
except ModuleNotFoundError as _error:  # hf.py not written yet
    if _error.name != "grpo_jax.text.hf":
        raise
    HFTokenizer = None

def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids a prompt is fed as: [BOS] + tokens (no BOS when there is none or the text's
    first token already is it)."""
    ids = tokenizer.encode(text)
    if tokenizer.bos_id >= 0 and ids[:1] != [tokenizer.bos_id]:
        ids = [tokenizer.bos_id, *ids]
    return ids


__all__ = [
    "DEFAULT_ALPHABET",
    "TAG_TOKENS",
    "CharTokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "prompt_ids",
]
