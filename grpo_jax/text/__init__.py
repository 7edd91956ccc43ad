"""Tokenizers: character level, SentencePiece, Hugging Face tokenizer.json.

Protocol shared by all of them:
    encode(text) -> list[int]   (no bos/eos added)
    decode(ids) -> str          (drops pad/bos/eos)
    vocab_size, pad_id, bos_id, eos_id
    token_to_id(token) -> int | None
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

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


try:
    from grpo_jax.text.hf import HFTokenizer
except ModuleNotFoundError as _error:  # hf.py not written yet
    if _error.name != "grpo_jax.text.hf":
        raise
    HFTokenizer = None

__all__ = [
    "DEFAULT_ALPHABET",
    "TAG_TOKENS",
    "CharTokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
]
