"""Hugging Face `tokenizers` tokenizer.json behind the grpo_jax Tokenizer protocol (offline)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

# Special-token spellings tried, in order, when neither the arguments nor
# tokenizer_config.json name them (Qwen2, Llama 3, Llama 2 / sentencepiece styles).
_CANDIDATES = {
    "pad": ("<|endoftext|>", "<|finetune_right_pad_id|>", "<pad>", "[PAD]"),
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]"),
    "eos": (
        "<|im_end|>",
        "<|eot_id|>",
        "<|end_of_text|>",
        "<|endoftext|>",
        "</s>",
        "<eos>",
        "[SEP]",
    ),
}


class HFTokenizer:
    """A tokenizer.json loaded with the `tokenizers` package.

    Special ids come from the constructor arguments, else from tokenizer_config.json next to
    tokenizer.json (pad_token / bos_token / eos_token), else from common spellings; a
    special that cannot be found is -1 (pad falls back to eos).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        pad_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ):
        """Loads `path` (a tokenizer.json file or a directory holding one).

        Args:
          path: tokenizer.json or its directory.
          pad_token, bos_token, eos_token: override the special-token spellings.
        """
        try:
            from tokenizers import Tokenizer as _RustTokenizer
        except ImportError as error:  # pragma: no cover - tokenizers is a core dependency
            raise ImportError("HFTokenizer needs the `tokenizers` package") from error
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise ValueError(
                f"{file}: tokenizer.json not found (copy it from the checkpoint "
                "directory; there is no network access at run time)"
            )
        self._tokenizer = _RustTokenizer.from_file(str(file))
        settings = {}
        config_file = file.parent / "tokenizer_config.json"
        if config_file.exists():
            settings = json.loads(config_file.read_text())
        given = {"pad": pad_token, "bos": bos_token, "eos": eos_token}
        ids = {}
        for kind in ("pad", "bos", "eos"):
            spelling = given[kind] or _spelling(settings.get(f"{kind}_token"))
            if given[kind] is not None and self._tokenizer.token_to_id(given[kind]) is None:
                raise ValueError(f"{file}: {kind}_token={given[kind]!r} is not in the vocabulary")
            candidates = (spelling,) if spelling else _CANDIDATES[kind]
            ids[kind] = next(
                (
                    self._tokenizer.token_to_id(c)
                    for c in candidates
                    if c and self._tokenizer.token_to_id(c) is not None
                ),
                -1,
            )
        if ids["pad"] == -1:
            ids["pad"] = ids["eos"]
        self._pad_id, self._bos_id, self._eos_id = ids["pad"], ids["bos"], ids["eos"]
        self._skip = {i for i in ids.values() if i >= 0}
        self.path = file

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def bos_id(self) -> int:
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with no special tokens added."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, dropping pad/bos/eos and other special tokens."""
        return self._tokenizer.decode(
            [int(i) for i in ids if int(i) not in self._skip], skip_special_tokens=True
        )

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, "
            f"pad_id={self.pad_id}, bos_id={self.bos_id}, eos_id={self.eos_id})"
        )


def _spelling(value) -> str | None:
    """tokenizer_config.json stores a token either as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value
