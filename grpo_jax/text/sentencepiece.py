"""SentencePiece tokenizer (https://github.com/google/sentencepiece): train and load.

Trained with digits split into single pieces, the think/answer tags as user-defined symbols
(one id each), identity normalisation and no dummy prefix, so decode(encode(text)) == text.
Ids: 0 <pad>, 1 <unk>, 2 <bos>, 3 <eos>; byte fallback keeps every character encodable.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import sentencepiece as spm

from grpo_jax.text.char import TAG_TOKENS
from grpo_jax.text.chat import ChatTemplated

MODEL_FILE = "spm.model"


class SentencePieceTokenizer(ChatTemplated):
    """Wraps a SentencePiece model (see module docstring).

    Args:
      path: a directory holding `spm.model`, or the .model file itself.
    """

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        model_file = os.path.join(path, MODEL_FILE) if os.path.isdir(path) else path
        if not os.path.isfile(model_file):
            raise FileNotFoundError(
                f"SentencePieceTokenizer: no model file {model_file!r}; create one with "
                f"SentencePieceTokenizer.train(texts, {path!r}, vocab_size=...)")
        self.model_file = model_file
        self._sp = spm.SentencePieceProcessor(model_file=model_file)
        self.vocab_size = int(self._sp.get_piece_size())
        self.pad_id, self.bos_id, self.eos_id = (
            int(self._sp.pad_id()), int(self._sp.bos_id()), int(self._sp.eos_id()))
        self._skip = {self.pad_id, self.bos_id, self.eos_id}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SentencePieceTokenizer":
        """Same as the constructor."""
        return cls(path)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        directory: str | os.PathLike,
        *,
        vocab_size: int = 512,
        model_type: str = "bpe",
        user_defined_symbols: Sequence[str] = TAG_TOKENS,
        character_coverage: float = 1.0,
        byte_fallback: bool = True,
        seed_sentencepiece_size: int | None = None,
    ) -> "SentencePieceTokenizer":
        """Trains a model on `texts` and writes `<directory>/spm.model` (+ .vocab).

        Args:
          texts: training texts (each a "sentence"; newlines inside are kept as characters).
          directory: output directory (created).
          vocab_size: number of pieces; with `byte_fallback` it must exceed 256 + specials.
          model_type: "bpe" or "unigram".
          user_defined_symbols: strings that always encode as one piece.
          character_coverage: share of characters covered by pieces (1.0: all).
          byte_fallback: encode unseen characters as UTF-8 bytes instead of <unk>.
          seed_sentencepiece_size: unigram seed size (None: SentencePiece default).

        Returns:
          the trained tokenizer.
        """
        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"model_type: expected 'bpe' or 'unigram', got {model_type!r}")
        texts = [t for t in texts if t]
        if not texts:
            raise ValueError("SentencePieceTokenizer.train: texts is empty")
        os.makedirs(directory, exist_ok=True)
        options = dict(
            sentence_iterator=iter(texts),
            model_prefix=os.path.join(os.fspath(directory), MODEL_FILE[: -len(".model")]),
            vocab_size=vocab_size,
            model_type=model_type,
            split_digits=True,
            user_defined_symbols=list(user_defined_symbols),
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            split_by_whitespace=True,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            hard_vocab_limit=False,
            max_sentence_length=1 << 16,
            num_threads=1,
            minloglevel=2,
        )
        if seed_sentencepiece_size is not None:
            options["seed_sentencepiece_size"] = seed_sentencepiece_size
        spm.SentencePieceTrainer.train(**options)
        return cls(directory)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion."""
        return (self.eos_id,)

    def id_to_token(self, token_id: int) -> str:
        """The piece of an id."""
        return self._sp.id_to_piece(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """Id of a piece; None if it is not a piece of the model."""
        token_id = int(self._sp.piece_to_id(token))
        if token_id == self._sp.unk_id() and token != self._sp.id_to_piece(token_id):
            return None
        return token_id

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no bos/eos)."""
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, dropping pad/bos/eos."""
        return self._sp.decode([int(i) for i in ids if int(i) not in self._skip])

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.model_file!r}, vocab_size={self.vocab_size})"
