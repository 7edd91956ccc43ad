"""Character-level tokenizer with multi-character special tokens.

Ids: 0 <pad>, 1 <bos>, 2 <eos>, then the tags "<think>", "</think>", "<answer>", "</answer>"
(each encoded as ONE id wherever it appears in the text), then one id per character.
"""

from __future__ import annotations

import json
import os
import string
from typing import Iterable, Sequence

from grpo_jax.text.chat import ChatTemplated

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
CONTROL_TOKENS = (PAD, BOS, EOS)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")

# Digits, ASCII letters, space, newline and ASCII punctuation (operators included).
DEFAULT_ALPHABET = string.digits + string.ascii_letters + " \n" + string.punctuation


class CharTokenizer(ChatTemplated):
    """One id per character, one id per tag, plus pad/bos/eos.

    Args:
      chars: the characters of the vocabulary (order kept, duplicates dropped).
      tags: multi-character tokens encoded as one id each.
    """

    def __init__(self, chars: Iterable[str] = DEFAULT_ALPHABET, tags: Sequence[str] = TAG_TOKENS):
        chars = list(dict.fromkeys(chars))
        for ch in chars:
            if not isinstance(ch, str) or len(ch) != 1:
                raise ValueError(f"CharTokenizer: chars must be single characters, got {ch!r}")
        tags = list(dict.fromkeys(tags))
        for tag in tags:
            if not isinstance(tag, str) or len(tag) < 2 or tag in CONTROL_TOKENS:
                raise ValueError(f"CharTokenizer: tags must be multi-character strings other "
                                 f"than {CONTROL_TOKENS}, got {tag!r}")
        self.chars = "".join(chars)
        self.tags = tuple(tags)
        self._id_to_token = [*CONTROL_TOKENS, *self.tags, *chars]
        self._token_to_id = {token: i for i, token in enumerate(self._id_to_token)}
        # Longest tags first so that a tag that is a prefix of another never wins.
        self._tags_by_first: dict[str, list[str]] = {}
        for tag in sorted(self.tags, key=len, reverse=True):
            self._tags_by_first.setdefault(tag[0], []).append(tag)
        self._skip = {self.pad_id, self.bos_id, self.eos_id}

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def for_task(cls, task=None, *, extra_chars: str = "") -> "CharTokenizer":
        """The default alphabet plus the task's `characters` and `extra_chars`; the task's
        `tags` are single ids after the think / answer tags."""
        chars = DEFAULT_ALPHABET + getattr(task, "characters", "") + extra_chars
        return cls(chars, tags=TAG_TOKENS + tuple(getattr(task, "tags", ())))

    @classmethod
    def for_texts(cls, texts: Iterable[str]) -> "CharTokenizer":
        """The smallest vocabulary covering `texts` (tags removed first), sorted."""
        seen: set[str] = set()
        for text in texts:
            for tag in TAG_TOKENS:
                text = text.replace(tag, "")
            seen.update(text)
        return cls(sorted(seen))

    # ---- protocol ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_token)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion."""
        return (self.eos_id,)

    def token_to_id(self, token: str) -> int | None:
        """Id of a character, a tag or a control token; None if not in the vocabulary."""
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str:
        """Token string of an id."""
        if not 0 <= int(token_id) < self.vocab_size:
            raise ValueError(f"CharTokenizer: id {token_id} out of range [0, {self.vocab_size})")
        return self._id_to_token[int(token_id)]

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no bos/eos added); each tag occurrence is one id.

        Raises:
          ValueError: a character of `text` is not in the vocabulary (named in the message).
        """
        ids: list[int] = []
        position, length = 0, len(text)
        token_to_id = self._token_to_id
        while position < length:
            ch = text[position]
            for tag in self._tags_by_first.get(ch, ()):
                if text.startswith(tag, position):
                    ids.append(token_to_id[tag])
                    position += len(tag)
                    break
            else:
                token_id = token_to_id.get(ch)
                if token_id is None:
                    raise ValueError(
                        f"CharTokenizer.encode: character {ch!r} (U+{ord(ch):04X}) at position "
                        f"{position} is not in the vocabulary; add it to `chars`")
                ids.append(token_id)
                position += 1
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, dropping pad/bos/eos (tags are kept as text).

        Raises:
          ValueError: an id outside [0, vocab_size).
        """
        pieces = []
        for token_id in ids:
            token_id = int(token_id)
            if token_id in self._skip:
                continue
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"CharTokenizer.decode: id {token_id} out of range "
                                 f"[0, {self.vocab_size})")
            pieces.append(self._id_to_token[token_id])
        return "".join(pieces)

    # ---- persistence -------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"type": "char", "chars": self.chars, "tags": list(self.tags)}

    def save(self, path: str | os.PathLike) -> None:
        """Writes the vocabulary as JSON."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CharTokenizer":
        """Reads a vocabulary written by `save`."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"CharTokenizer.load: no file {os.fspath(path)!r}; write one "
                                    "with CharTokenizer.for_task(task).save(path)")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("type") != "char" or "chars" not in data:
            raise ValueError(f"CharTokenizer.load: {os.fspath(path)!r} is not a CharTokenizer "
                             "file (expected keys type='char', chars, tags)")
        return cls(data["chars"], data.get("tags", TAG_TOKENS))

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.chars, self.tags))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
