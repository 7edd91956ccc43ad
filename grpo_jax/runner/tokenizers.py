"""The run's tokenizer: its kind ("auto" resolved), building it, and its checks against the
template and model.init_from's vocabulary."""

from __future__ import annotations

import os
import re
import tempfile

from grpo_jax import storage
from grpo_jax import tasks as tasks_lib
from grpo_jax import text
from grpo_jax.models import ModelConfig
from grpo_jax.runner.checks import ConfigError, check_vocabulary
from grpo_jax.runner.prompts import prompt_of
from grpo_jax.runner.run_directory import run_directory_config
from grpo_jax.text.sentencepiece import MODEL_FILE

TOKENIZERS = ("auto", "char", "sentencepiece", "checkpoint")


def tokenizer_kind(config) -> str:
    """config.tokenizer with "auto" resolved: with model.init_from, that run's tokenizer
    ("run", for a grpo_jax run directory) or the checkpoint's own ("checkpoint"); else the
    task's character tokenizer."""
    if config.tokenizer == "auto":
        if not config.model.init_from:
            return "char"
        return "run" if run_directory_config(config.model.init_from) is not None \
            else "checkpoint"
    return config.tokenizer

def build_tokenizer(config, task, workdir: str | None):
    """The run's tokenizer (`_build`), with task.chat_template's chat template when the
    config names one (a built-in template or a Jinja file; else a checkpoint's own)."""
    tokenizer = _build(config, task, workdir)
    own = config.task.get("chat_template", "")
    if own and tokenizer is not None:
        tokenizer.chat_template = text.chat.chat_template_source(own)
    return tokenizer


def _build(config, task, workdir: str | None):
    """The run's tokenizer. "checkpoint" is model.init_from's tokenizer.json with its special
    tokens and chat template. sentencepiece is trained once on the training problems and
    their clean solutions and kept in `<workdir>/tokenizer`, so a resumed run has the same
    vocabulary; `workdir=None` gives None for it (nothing is written). SentencePiece reads
    and writes local files only: for a workdir on an object store the model is trained in,
    or copied to, a local temporary directory and copied to or from the workdir."""
    kind = tokenizer_kind(config)
    if kind == "run":  # the base run's own tokenizer, built as that run built it
        base = run_directory_config(config.model.init_from)
        base_task = tasks_lib.task_of(base.task.name, base.task.kwargs.to_dict())[0]
        return build_tokenizer(base, base_task, config.model.init_from)
    if kind == "char":
        return text.CharTokenizer.for_task(task)
    if kind == "checkpoint":
        if not config.model.init_from:
            raise ValueError("tokenizer: 'checkpoint' needs model.init_from (a local Hugging "
                             "Face checkpoint directory with tokenizer.json)")
        return text.HFTokenizer(config.model.init_from)
    if kind == "sentencepiece":
        if workdir is None:
            return None
        directory = storage.join(workdir, "tokenizer")
        local = storage.local_path(directory) or tempfile.mkdtemp(prefix="grpo_jax_spm_")
        remote = storage.local_path(directory) is None
        if storage.isfile(storage.join(directory, MODEL_FILE)):
            if remote:  # the model stays there for the process (the tokenizer names it)
                _copy_files(directory, local, [MODEL_FILE])
            return text.SentencePieceTokenizer.load(local)
        examples = task.examples("train", min(config.task.train_size, 4000), seed=config.seed)
        # the prompts as the run writes them (a chat template rendered without the
        # tokenizer it is training: its special tokens are not known yet)
        renderer = _TemplateOnly(config.task.get("chat_template", ""))
        texts = [prompt_of(config, task, renderer, ex) + (ex.solution or "")
                 for ex in examples]
        try:
            tokenizer = text.SentencePieceTokenizer.train(
                texts, local, vocab_size=config.tokenizer_vocab_size,
                user_defined_symbols=text.TAG_TOKENS + tuple(task.tags))
        except RuntimeError as err:  # sentencepiece's own check, e.g. "12 vs 283"
            needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
            if needed is None:
                raise
            raise ConfigError(
                f"tokenizer_vocab_size: {config.tokenizer_vocab_size} is smaller than the "
                f"{needed.group(1)} characters and symbols of the task's text; expected >= "
                f"{needed.group(1)} (plus the pieces to learn)") from None
        if remote:
            storage.makedirs(directory)
            _copy_files(local, directory, os.listdir(local))
        return tokenizer
    raise ValueError(f"tokenizer: unknown tokenizer {config.tokenizer!r}; expected one of "
                     f"{list(TOKENIZERS)}")

class _TemplateOnly(text.chat.ChatTemplated):
    """A chat template without a tokenizer (no special tokens), or None."""

    bos_id = eos_id = pad_id = -1

    def __init__(self, name: str):
        self.chat_template = text.chat.chat_template_source(name) if name else None

    def id_to_token(self, token_id: int) -> None:
        return None


def _copy_files(source: str, target: str, names) -> None:
    """Copies the files `names` of directory `source` into directory `target` (either may
    be a URL)."""
    for name in names:
        storage.write_bytes(storage.join(target, name),
                            storage.read_bytes(storage.join(source, name)))

def check_tokenizer(config, tokenizer, checkpoint_model: ModelConfig | None) -> None:
    """The built tokenizer fits the template (a chat template for "chat") and the
    checkpoint's vocabulary."""
    if config.task.template == "chat" and tokenizer.chat_template is None:
        raise ConfigError(f"task.template: 'chat': {config.model.init_from!r} has no chat "
                          "template (tokenizer_config.json chat_template or "
                          "chat_template.jinja); set task.chat_template or use r1_zero or "
                          "plain")
    if checkpoint_model is not None:
        check_vocabulary(tokenizer, checkpoint_model.vocab_size, config.model.init_from)
