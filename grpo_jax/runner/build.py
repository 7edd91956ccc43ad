"""What a run is built from: its tokenizer and its model, from the config."""

from __future__ import annotations

import os

from flax import nnx

from grpo_jax import text
from grpo_jax.models import Transformer, named_config
from grpo_jax.tasks import apply_template

# ModelConfig fields a config may override on top of config.model.name (None = the size's).
MODEL_SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "mlp_size", "rope_theta", "qkv_bias", "tie_embeddings", "rms_norm_eps",
                      "remat")


TOKENIZERS = ("auto", "char", "sentencepiece", "checkpoint")


def tokenizer_kind(config) -> str:
    """config.tokenizer with "auto" resolved: the checkpoint's own tokenizer when
    model.init_from is set, else the task's character tokenizer."""
    if config.tokenizer == "auto":
        return "checkpoint" if config.model.init_from else "char"
    return config.tokenizer


def build_tokenizer(config, task, workdir: str | None):
    """The run's tokenizer. "checkpoint" is model.init_from's tokenizer.json with its special
    tokens and chat template. sentencepiece is trained once on the training problems and
    their clean solutions and kept in `<workdir>/tokenizer`, so a resumed run has the same
    vocabulary; `workdir=None` gives None for it (nothing is written)."""
    kind = tokenizer_kind(config)
    if kind == "char":
        return text.CharTokenizer.for_task(task)
    if kind == "checkpoint":
        if not config.model.init_from:
            raise ValueError("tokenizer: 'checkpoint' needs model.init_from (a local Hugging "
                             "Face checkpoint directory with tokenizer.json)")
        return text.HFTokenizer(config.model.init_from)
    if kind == "sentencepiece":
        from grpo_jax.text.sentencepiece import MODEL_FILE

        if workdir is None:
            return None
        directory = os.path.join(workdir, "tokenizer")
        if os.path.isfile(os.path.join(directory, MODEL_FILE)):
            return text.SentencePieceTokenizer.load(directory)
        examples = task.examples("train", min(config.task.train_size, 4000), seed=config.seed)
        texts = [apply_template(ex, template=config.task.template) + (ex.solution or "")
                 for ex in examples]
        return text.SentencePieceTokenizer.train(texts, directory,
                                                 vocab_size=config.tokenizer_vocab_size)
    raise ValueError(f"tokenizer: unknown tokenizer {config.tokenizer!r}; expected one of "
                     f"{list(TOKENIZERS)}")


def model_config_for(config, vocab_size: int, name: str | None = None):
    """The named model (default config.model.name) sized for the vocabulary and the run.

    config.model's shape overrides (hidden_size, num_layers, ...) apply to the run's own
    model, not to another named size (e.g. a distillation student)."""
    overrides = {}
    if name is None:
        overrides = {field: config.model[field] for field in MODEL_SHAPE_FIELDS
                     if config.model.get(field) is not None}
    return named_config(name or config.model.name, vocab_size=vocab_size,
                        max_seq_len=config.model.max_seq_len, dtype=config.model.dtype,
                        param_dtype=config.model.param_dtype, **overrides)


def build_model(config, tokenizer):
    """(ModelConfig, NNX model): a local Hugging Face checkpoint, or a fresh named size."""
    if config.model.init_from:
        from grpo_jax.models import from_pretrained

        model, model_config = from_pretrained(config.model.init_from, dtype=config.model.dtype,
                                              param_dtype=config.model.param_dtype)
        if config.model.get("remat") is not None and config.model.remat != model_config.remat:
            model_config = model_config.replace(remat=config.model.remat)
            model.config = model_config
        return model_config, model
    model_config = model_config_for(config, tokenizer.vocab_size)
    return model_config, Transformer(model_config, rngs=nnx.Rngs(config.seed))
