"""Hugging Face `tokenizers` tokenizer.json behind the grpo_jax Tokenizer protocol (offline)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from grpo_jax.json_files import load_json_file
from grpo_jax.text.chat import CHAT_TEMPLATE_FILE, ChatTemplated, load_chat_template

# The files of a Hugging Face tokenizer that travel with it (an export copies them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", CHAT_TEMPLATE_FILE, "vocab.json", "merges.txt",
                   "added_tokens.json")

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


class HFTokenizer(ChatTemplated):
    """A tokenizer.json loaded with the `tokenizers` package.

    Special ids come from the constructor arguments, else from tokenizer_config.json next to
    tokenizer.json (pad_token / bos_token / eos_token; an explicit null means none, as
    Qwen2's bos_token), else from common spellings; a special that cannot be found is -1
    (pad falls back to eos; a missing eos is an error). `eos_ids` adds the end ids of
    generation_config.json. `chat_template` is the checkpoint's Jinja chat template (or None).
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
        try:  # bad JSON (serde's message names its line and column, and stops at 128 levels)
            self._tokenizer = _RustTokenizer.from_file(str(file))
        except Exception as error:  # noqa: BLE001  the Rust side raises a bare Exception
            raise ValueError(f"{file}: not a tokenizer.json the tokenizers package can read "
                             f"({' '.join(str(error).split())})") from None
        settings = {}
        config_file = file.parent / "tokenizer_config.json"
        if config_file.exists():
            settings = _read_json(config_file)
        given = {"pad": pad_token, "bos": bos_token, "eos": eos_token}
        ids = {}
        for kind in ("pad", "bos", "eos"):
            key = f"{kind}_token"
            if given[kind] is not None and self._tokenizer.token_to_id(given[kind]) is None:
                raise ValueError(f"{file}: {key}={given[kind]!r} is not in the vocabulary")
            if given[kind] is None and key in settings and settings[key] is None:
                ids[kind] = -1  # tokenizer_config.json says there is none (Qwen2: no BOS)
                continue
            spelling = given[kind] or _spelling(settings.get(key))
            if spelling and self._tokenizer.token_to_id(spelling) is None:
                raise ValueError(f"{config_file}: {key}={spelling!r} is not in "
                                 "tokenizer.json's vocabulary")
            candidates = (spelling,) if spelling else _CANDIDATES[kind]
            ids[kind] = next((self._tokenizer.token_to_id(c) for c in candidates
                              if c and self._tokenizer.token_to_id(c) is not None), -1)
        if ids["pad"] == -1:
            ids["pad"] = ids["eos"]
        if ids["eos"] == -1:
            raise ValueError(f"{file}: no end-of-sequence token found; name it with "
                             "eos_token in tokenizer_config.json")
        self._pad_id, self._bos_id, self._eos_id = ids["pad"], ids["bos"], ids["eos"]
        # generation_config.json may list more ids that end a turn (instruct models: the
        # end-of-turn token and the end-of-text token).
        eos_ids = [self._eos_id]
        generation_file = file.parent / "generation_config.json"
        if generation_file.exists() and eos_token is None:
            listed = _read_json(generation_file).get("eos_token_id")
            listed = listed if isinstance(listed, list) else [listed]
            for token_id in listed:
                if isinstance(token_id, int) and 0 <= token_id < self.vocab_size \
                        and token_id not in eos_ids:
                    eos_ids.append(token_id)
        self._eos_ids = tuple(eos_ids)
        self._skip = {i for i in (*ids.values(), *eos_ids) if i >= 0}
        self.chat_template = load_chat_template(file.parent, settings)
        self.path = file

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(int(token_id))

    def _no_template(self) -> str:
        return (f"{self.path.parent}: no chat template (neither tokenizer_config.json's "
                f"chat_template nor {CHAT_TEMPLATE_FILE}); use task.template=r1_zero or plain")

    def files(self) -> list[Path]:
        """The tokenizer's files next to tokenizer.json (what an export copies)."""
        return [self.path.parent / name for name in TOKENIZER_FILES
                if (self.path.parent / name).is_file()]

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

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion: eos, then generation_config.json's others."""
        return self._eos_ids

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


def _read_json(file: Path) -> dict:
    try:
        value = load_json_file(file)  # invalid or too deeply nested: names the line
    except OSError as error:
        raise ValueError(f"{file}: not readable ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value


def _spelling(value) -> str | None:
    """tokenizer_config.json stores a token either as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value
