"""What a run is built from: its task, tokenizer, prompt bucket and model, from the config.

`build_inputs(config)` builds the task, model.init_from's model config, the tokenizer and
the prompt bucket once, at start-up, into a frozen `RunInputs` that validation checks the
stages against and the `Run` then uses (nothing is rebuilt). A sentencepiece tokenizer is
trained in the workdir, so its `RunInputs` has no tokenizer and no bucket until the Run
trains it (`with_tokenizer`). A problem is a ConfigError naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any, NamedTuple

import ml_collections
from flax import nnx

from grpo_jax import parallel, storage
from grpo_jax import tasks as tasks_lib
from grpo_jax import text
from grpo_jax.models import ModelConfig, Transformer, named_config
from grpo_jax.models import lora
from grpo_jax.runner.checks import ConfigError, check_vocabulary
from grpo_jax.tasks.data import load_json_file

# ModelConfig fields a config may override on top of config.model.name (None = the size's).
MODEL_SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "mlp_size", "rope_theta", "qkv_bias", "tie_embeddings", "rms_norm_eps",
                      "remat", "scan_layers", "attention")
# Of those, the fields of how the network is executed, not of its shape (a config may set
# them with model.init_from too).
EXECUTION_FIELDS = ("remat", "scan_layers", "attention")


TOKENIZERS = ("auto", "char", "sentencepiece", "checkpoint")
PROMPT_BUCKET_MULTIPLE = 8  # task.prompt_len = 0: the longest prompt rounded up to this
CONFIG_FILE = "config.json"  # a run's config, in its workdir
HISTORY_FIELD = "_history"  # config.json: earlier configs of the run (extensions)


def run_directory_config(path) -> ml_collections.ConfigDict | None:
    """The config of a grpo_jax run directory (config.json with "stages", and checkpoints/),
    or None when `path` is not one (e.g. a Hugging Face checkpoint directory)."""
    file = os.path.join(path or "", CONFIG_FILE)
    if not path or not os.path.isfile(file) or \
            not os.path.isdir(os.path.join(path, "checkpoints")):
        return None
    record = load_json_file(file)  # a ValueError naming the file and line
    if not isinstance(record, dict) or "stages" not in record:
        return None
    record.pop(HISTORY_FIELD, None)
    return ml_collections.ConfigDict(record)


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
    """The run's tokenizer. "checkpoint" is model.init_from's tokenizer.json with its special
    tokens and chat template. sentencepiece is trained once on the training problems and
    their clean solutions and kept in `<workdir>/tokenizer`, so a resumed run has the same
    vocabulary; `workdir=None` gives None for it (nothing is written). SentencePiece reads
    and writes local files only: for a workdir on an object store the model is trained in,
    or copied to, a local temporary directory and copied to or from the workdir."""
    kind = tokenizer_kind(config)
    if kind == "run":  # the base run's own tokenizer, built as that run built it
        base = run_directory_config(config.model.init_from)
        base_task = tasks_lib.get_task(base.task.name, **base.task.kwargs.to_dict())
        return build_tokenizer(base, base_task, config.model.init_from)
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
        directory = storage.join(workdir, "tokenizer")
        local = storage.local_path(directory) or tempfile.mkdtemp(prefix="grpo_jax_spm_")
        remote = storage.local_path(directory) is None
        if storage.isfile(storage.join(directory, MODEL_FILE)):
            if remote:  # the model stays there for the process (the tokenizer names it)
                _copy_files(directory, local, [MODEL_FILE])
            return text.SentencePieceTokenizer.load(local)
        examples = task.examples("train", min(config.task.train_size, 4000), seed=config.seed)
        texts = [tasks_lib.apply_template(ex, template=config.task.template) + (ex.solution or "")
                 for ex in examples]
        tokenizer = text.SentencePieceTokenizer.train(
            texts, local, vocab_size=config.tokenizer_vocab_size,
            user_defined_symbols=text.TAG_TOKENS + tuple(task.tags))
        if remote:
            storage.makedirs(directory)
            _copy_files(local, directory, os.listdir(local))
        return tokenizer
    raise ValueError(f"tokenizer: unknown tokenizer {config.tokenizer!r}; expected one of "
                     f"{list(TOKENIZERS)}")


def _copy_files(source: str, target: str, names) -> None:
    """Copies the files `names` of directory `source` into directory `target` (either may
    be a URL)."""
    for name in names:
        storage.write_bytes(storage.join(target, name),
                            storage.read_bytes(storage.join(source, name)))


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


def run_model_config(config, tokenizer, meta: dict | None = None):
    """(ModelConfig, Hugging Face model_type or None) of the policy of a run with `config`:
    its named size with overrides (or the size a distillation stage switched to, in the
    checkpoint `meta`), or the shape of its model.init_from (a Hugging Face checkpoint or,
    in turn, another run)."""
    meta = meta or {}
    if meta.get("model_name"):
        return model_config_for(config, tokenizer.vocab_size, meta["model_name"]), None
    init = config.model.init_from
    if init:
        base = run_directory_config(init)
        if base is not None:
            return run_model_config(base, tokenizer, policy_meta(init))
        from grpo_jax.models.hf import config_from_hf

        hf = load_json_file(os.path.join(init, "config.json"))
        return (config_from_hf(hf, dtype=config.model.dtype,
                               param_dtype=config.model.param_dtype, path=init),
                hf.get("model_type"))
    return model_config_for(config, tokenizer.vocab_size), None


def _checkpoint_of(workdir: str, stage: str | None = None):
    """(step, meta) of the checkpoint holding a run's policy: the latest that ended a stage
    (of `stage`, when given)."""
    from grpo_jax.checkpoint import Checkpointer

    with Checkpointer(os.path.join(workdir, "checkpoints")) as checkpointer:
        steps = checkpointer.all_steps()
        kept = []
        for step in reversed(steps):
            meta = checkpointer.restore_meta(step)
            kept.append(meta.get("stage"))
            if meta.get("stage_done") and (stage is None or meta.get("stage") == stage):
                return step, meta
    where = f"of stage {stage!r} " if stage else ""
    raise FileNotFoundError(
        f"{workdir}: no finished checkpoint {where}is kept in its checkpoints/ (kept: "
        f"{sorted(set(map(str, kept))) or 'none'}; train the run first, and "
        "checkpoint.max_to_keep bounds how many are kept)")


def policy_meta(workdir: str) -> dict:
    return _checkpoint_of(workdir)[1]


def load_run_policy(workdir: str, *, stage: str | None = None, tokenizer=None,
                    dtype: str | None = None, param_dtype: str | None = None):
    """The policy of a grpo_jax run: (ModelConfig, Transformer with its parameters, meta,
    Hugging Face model_type or None), from its latest finished-stage checkpoint (or stage
    `stage`'s). Restored onto this process's first device. A LoRA run's checkpoints hold
    its adapters only: its base is built as the run built it and the adapters merged in
    (W + (alpha / r) A B, in the base's dtype).

    Raises:
      FileNotFoundError: the run has no such checkpoint (the message says which are kept).
    """
    import jax

    from grpo_jax.checkpoint import Checkpointer

    config = run_directory_config(workdir)
    if config is None:
        raise FileNotFoundError(f"{workdir}: not a grpo_jax run directory (no config.json "
                                "with stages and no checkpoints/)")
    if tokenizer is None:
        task = None if tokenizer_kind(config) == "checkpoint" else tasks_lib.get_task(
            config.task.name, **config.task.kwargs.to_dict())
        tokenizer = build_tokenizer(config, task, workdir)
    step, meta = _checkpoint_of(workdir, stage)
    spec = lora_config(config)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def on_device(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            tree)

    if spec is None:
        model_config, model_type = run_model_config(config, tokenizer, meta)
    else:
        model_config, base_model = build_model(config, tokenizer)
        model_type = run_model_config(config, tokenizer, meta)[1]
        base = nnx.to_pure_dict(nnx.state(base_model))
        del base_model
        adapters = jax.eval_shape(lambda: lora.init_adapters(
            base, jax.random.key(0), rank=spec.rank, targets=spec.targets))
    model_config = model_config.replace(dtype=dtype or model_config.dtype,
                                        param_dtype=param_dtype or model_config.param_dtype)
    model = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
    state = nnx.state(model)
    like = nnx.to_pure_dict(state)
    saved = {"params": on_device(like if spec is None else {lora.ADAPTERS: adapters}),
             "rng": jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=device)}
    with Checkpointer(os.path.join(workdir, "checkpoints")) as checkpointer:
        restored, _ = checkpointer.restore(step, target=saved)
    params = restored["params"]
    if spec is not None:
        params = lora.merge(base, params[lora.ADAPTERS], alpha=spec.alpha, rank=spec.rank)
    cast = jax.tree.map(lambda x, ref: x.astype(ref.dtype), params, like)
    nnx.replace_by_pure_dict(state, cast)
    nnx.update(model, state)
    return model_config, model, meta, model_type


class FinishedRun(NamedTuple):
    """A finished run's final policy with what it was trained on (`load_finished_run`)."""
    config: ml_collections.ConfigDict
    task: Any
    tokenizer: Any
    policy: Any  # training.Policy
    params: Any


def load_finished_run(workdir: str) -> FinishedRun:
    """The config, task, tokenizer, policy and final parameters of a grpo_jax run directory,
    built as the run built them (`load_run_policy`): what a study or an evaluation script
    needs from a finished run.

    Raises:
      FileNotFoundError: `workdir` is not a grpo_jax run directory, or has no checkpoint.
    """
    from grpo_jax.training import Policy  # pylint: disable=import-outside-toplevel

    config = run_directory_config(workdir)
    if config is None:
        raise FileNotFoundError(f"{workdir}: not a grpo_jax run directory (no config.json "
                                "with stages and no checkpoints/)")
    task = build_task(config)
    tokenizer = build_tokenizer(config, task, workdir)
    _, model, _, _ = load_run_policy(workdir, tokenizer=tokenizer)
    policy, params = Policy.from_model(model)
    return FinishedRun(config, task, tokenizer, policy, params)


def build_model(config, tokenizer):
    """(ModelConfig, NNX model): a local Hugging Face checkpoint, another run's final
    policy (model.init_from = a grpo_jax run directory), or a fresh named size. With LoRA
    (model.lora_rank > 0) its parameters, the frozen base, are in the compute dtype."""
    param_dtype = base_param_dtype(config)
    if config.model.init_from and run_directory_config(config.model.init_from) is not None:
        model_config, model, _, _ = load_run_policy(
            config.model.init_from, tokenizer=tokenizer, dtype=config.model.dtype,
            param_dtype=param_dtype)
    elif config.model.init_from:
        from grpo_jax.models import from_pretrained

        model, model_config = from_pretrained(config.model.init_from, dtype=config.model.dtype,
                                              param_dtype=param_dtype)
    else:
        model_config = model_config_for(config, tokenizer.vocab_size).replace(
            param_dtype=param_dtype)
        return model_config, Transformer(model_config, rngs=nnx.Rngs(config.seed))
    numerics = {field: config.model.get(field) for field in EXECUTION_FIELDS
                if config.model.get(field) is not None}
    if any(getattr(model_config, field) != value for field, value in numerics.items()):
        model_config = model_config.replace(**numerics)
        model.config = model_config
    return model_config, model


def lora_targets(config) -> tuple[str, ...]:
    """model.lora_targets as kernel names ("q_kernel,v_kernel" on the command line gives one
    string: its comma-separated names count)."""
    value = config.model.get("lora_targets", ())
    items = [value] if isinstance(value, str) else list(value)
    return tuple(name.strip() for item in items for name in str(item).split(",")
                 if name.strip())


def lora_config(config) -> lora.LoraConfig | None:
    """The run's LoRA settings (model.lora_rank, lora_alpha, lora_targets); None when
    lora_rank is 0 (or absent: a run from before the field)."""
    rank = config.model.get("lora_rank", 0)
    if not rank:
        return None
    return lora.LoraConfig(rank=int(rank), alpha=float(config.model.lora_alpha),
                           targets=lora_targets(config))


def base_param_dtype(config) -> str:
    """The dtype the run's parameters are stored in: model.param_dtype, or with LoRA the
    compute dtype model.dtype (the base is frozen: no master copy to keep in float32)."""
    return config.model.dtype if lora_config(config) is not None else config.model.param_dtype


def with_lora(config, policy, params, mesh, *, seed: int):
    """(policy, params) of the run's model with LoRA when model.lora_rank > 0: the policy
    merges adapters (`Policy.lora`) and the parameters are {"base": params, "lora": fresh
    adapters} (`lora.init_adapters` with key `seed`, replicated on the mesh); as given
    without LoRA."""
    import jax

    spec = lora_config(config)
    if spec is None:
        return policy, params
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    adapters = jax.jit(  # one global program: every process holds the same adapters
        lambda: lora.init_adapters(shapes, jax.random.key(seed), rank=spec.rank,
                                   targets=spec.targets),
        out_shardings=parallel.replicated_sharding(mesh))()
    return dataclasses.replace(policy, lora=spec), lora.combine(params, adapters)


def lora_summary(config, model_config: ModelConfig) -> str | None:
    """One line on the run's LoRA for `--print_config` (None without LoRA)."""
    import jax

    spec = lora_config(config)
    if spec is None:
        return None
    model = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
    adapters = jax.eval_shape(lambda: lora.init_adapters(
        nnx.to_pure_dict(nnx.state(model)), jax.random.key(0), rank=spec.rank,
        targets=spec.targets))
    count = lora.num_adapter_params(adapters)
    return (f"lora: rank {spec.rank}, alpha {spec.alpha:g} on {', '.join(spec.targets)}: "
            f"{count:,} trainable float32 parameters ({100 * count / model_config.num_params():.2f}"
            f"% of the model), the base frozen in {config.model.dtype}")


# ---------------------------------------------------------------------- the run's inputs
@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What start-up builds once and the Run uses as is.

    Attributes:
      task: the task (config.task.name with config.task.kwargs).
      tokenizer: the run's tokenizer; None when it is trained in the workdir
        (sentencepiece), which the Run does first (`with_tokenizer`).
      prompt_len: the prompt bucket (task.prompt_len, or the measured one when it is 0);
        None while the tokenizer is.
      checkpoint_model: model.init_from's ModelConfig (None without model.init_from).
    """

    task: Any
    tokenizer: Any
    prompt_len: int | None
    checkpoint_model: ModelConfig | None


def build_task(config):
    """The task of config.task (ConfigError naming the constructor argument at fault)."""
    try:
        return tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
    except (TypeError, ValueError) as err:
        message, field = str(err), ""
        for name in config.task.kwargs:  # "data_dir: ..." names a constructor argument
            if message.startswith(f"{name}: "):
                message, field = message[len(name) + 2:], f".{name}"
        raise ConfigError(f"task.kwargs{field}: {message}") from None


def _prepare_init_from(path: str) -> str:
    """How to make `path` something model.init_from can start from (the commands)."""
    return (f"prepare it first: a base run with `python -m grpo_jax.main "
            f"--config=configs/default.py --config.stages=pretrain --workdir={path}`, or a "
            f"Hugging Face checkpoint with `hf download ORG/NAME --local-dir {path}` on a "
            "machine with network (there is none at run time)")


def init_from_missing(path: str) -> ConfigError:
    """The one-line error for a model.init_from that does not exist."""
    return ConfigError(f"model.init_from: {path!r} does not exist; expected a Hugging Face "
                       "checkpoint directory or a grpo_jax run directory (the workdir of an "
                       f"earlier run); {_prepare_init_from(path)}")


def check_init_from(path: str) -> None:
    """model.init_from is a directory a run can start from: a Hugging Face checkpoint
    (config.json) or a grpo_jax run directory with checkpoints/ (a ConfigError saying how
    to prepare one otherwise, or naming the file and line of an unreadable config.json)."""
    if not os.path.exists(path):
        raise init_from_missing(path)
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise ConfigError(f"model.init_from: {path!r} is neither a Hugging Face checkpoint "
                          "directory (config.json) nor a grpo_jax run directory (config.json "
                          f"and checkpoints/); {_prepare_init_from(path)}")
    try:
        record = load_json_file(file)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.init_from: {err}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"model.init_from: {file}: expected a JSON object, got "
                          f"{type(record).__name__}")
    if "stages" in record and not os.path.isdir(os.path.join(path, "checkpoints")):
        raise ConfigError(f"model.init_from: {path!r} is a grpo_jax run directory without "
                          "checkpoints/ (that run saved none yet); train it first: `python -m "
                          f"grpo_jax.main --config=<its config> --workdir={path}` (the same "
                          "command resumes it)")


def checkpoint_config(config) -> ModelConfig:
    """The ModelConfig of model.init_from: a Hugging Face checkpoint's config.json, or the
    policy of a grpo_jax run directory (ConfigError naming the field)."""
    from grpo_jax.models.hf import config_from_hf

    path = config.model.init_from
    check_init_from(path)
    base = run_directory_config(path)
    if base is not None:
        try:
            base_task = tasks_lib.get_task(base.task.name, **base.task.kwargs.to_dict())
            tokenizer = build_tokenizer(base, base_task, path)
            model_config, _ = run_model_config(base, tokenizer, policy_meta(path))
        except (FileNotFoundError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"model.init_from: {err}") from None
        if config.model.max_seq_len > model_config.max_seq_len:
            raise ConfigError(f"model.max_seq_len: {config.model.max_seq_len} exceeds the "
                              f"base run's context {model_config.max_seq_len}")
        return model_config
    try:
        hf = load_json_file(os.path.join(path, CONFIG_FILE))
        model_config = config_from_hf(hf, dtype=config.model.dtype,
                                      param_dtype=config.model.param_dtype, path=path)
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"model.init_from: {err}") from None
    if config.model.max_seq_len > model_config.max_seq_len:
        raise ConfigError(f"model.max_seq_len: {config.model.max_seq_len} exceeds the "
                          f"checkpoint's max_position_embeddings {model_config.max_seq_len}")
    return model_config


def check_tokenizer(config, tokenizer, checkpoint_model: ModelConfig | None) -> None:
    """The built tokenizer fits the template (a chat template for "chat") and the
    checkpoint's vocabulary."""
    if config.task.template == "chat" and tokenizer.chat_template is None:
        raise ConfigError(f"task.template: 'chat': {config.model.init_from!r} has no chat "
                          "template (tokenizer_config.json chat_template or "
                          "chat_template.jinja); use r1_zero or plain")
    if checkpoint_model is not None:
        check_vocabulary(tokenizer, checkpoint_model.vocab_size, config.model.init_from)


def eval_seed(config) -> int:
    """The seed of the held-out problems: task.eval_seed (fixed across a sweep's seeds), or
    the run's seed for a config without the field."""
    return int(config.task.get("eval_seed", config.seed))


def prompt_bucket(config, task, tokenizer) -> int:
    """The prompt bucket: task.prompt_len, checked to hold the longest prompt (BOS included)
    of the training and held-out problems; with task.prompt_len = 0 that longest prompt
    rounded up to a multiple of PROMPT_BUCKET_MULTIPLE."""
    template = config.task.template
    examples = []
    for split, field in (("train", "train_size"), ("test", "eval_size")):
        try:
            examples += task.examples(split, config.task[field], seed=eval_seed(config)
                                      if split == "test" else config.seed)
        except ValueError as err:  # too few problems, or a data file that does not read
            message = str(err)
            in_file = os.path.isfile(message.split(":", 1)[0])  # "<file>:<line>: ..."
            raise ConfigError(f"{'task' if in_file else f'task.{field}'}: {message}") from None
    longest, where = 0, None
    for ex in examples:
        try:
            prompt = tasks_lib.apply_template(ex, template=template, tokenizer=tokenizer)
            length = len(text.prompt_ids(tokenizer, prompt))
        except ValueError as err:  # e.g. a character the char tokenizer does not have
            raise ConfigError(f"task: problem {getattr(ex, 'id', '?')!r}: {err}") from None
        if length > longest:
            longest, where = length, ex
    if not config.task.prompt_len:
        return -(-longest // PROMPT_BUCKET_MULTIPLE) * PROMPT_BUCKET_MULTIPLE
    if longest > config.task.prompt_len:
        raise ConfigError(f"task.prompt_len: {config.task.prompt_len} cannot hold prompt "
                          f"{getattr(where, 'id', '?')!r} of {longest} tokens (with BOS); "
                          f"expected >= {longest} (or 0: measured at start-up)")
    return config.task.prompt_len


def with_tokenizer(config, inputs: RunInputs, tokenizer) -> RunInputs:
    """`inputs` with `tokenizer` (trained in the workdir), checked, and its prompt bucket."""
    check_tokenizer(config, tokenizer, inputs.checkpoint_model)
    return dataclasses.replace(inputs, tokenizer=tokenizer,
                               prompt_len=prompt_bucket(config, inputs.task, tokenizer))


def build_inputs(config) -> RunInputs:
    """The task, model.init_from's model config, the tokenizer (unless it is trained in the
    workdir) and the prompt bucket of a config whose run-wide fields are checked."""
    task = build_task(config)
    checkpoint_model = checkpoint_config(config) if config.model.init_from else None
    inputs = RunInputs(task, None, None, checkpoint_model)
    if tokenizer_kind(config) != "sentencepiece":  # else trained in the workdir, by the Run
        try:
            tokenizer = build_tokenizer(config, task, None)
        except ValueError as err:
            raise ConfigError(f"tokenizer: {err}") from None
        inputs = with_tokenizer(config, inputs, tokenizer)
    check_checkpoint_files(config)
    return inputs


def check_checkpoint_files(config) -> None:
    """model.init_from's safetensors files are there and complete (their headers against
    their lengths: a download or copy cut short), before the workdir is touched: the Run
    reads the tensors only after creating it."""
    path = config.model.init_from
    if not path or run_directory_config(path) is not None:
        return
    from grpo_jax.models.hf import check_tensor_files

    try:
        check_tensor_files(path)
    except ValueError as err:
        raise ConfigError(f"model.init_from: {err}") from None
