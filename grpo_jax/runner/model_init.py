"""The run's model: its ModelConfig, building it (fresh, from a Hugging Face checkpoint or
from another run's final policy: model.init_from, checked here), loading a run's policy,
and LoRA.

`build_model` and `load_run_policy` call each other: a run started from another run loads
that run's policy, and a LoRA run's policy is its base, built as the run built it, with
its adapters merged in.
"""

from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from grpo_jax import parallel
from grpo_jax import tasks as tasks_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.json_files import load_json_file
from grpo_jax.models import ModelConfig, Transformer, from_pretrained, lora, named_config
from grpo_jax.models.hf import check_tensor_files, config_from_hf
from grpo_jax.runner.checks import ConfigError
from grpo_jax.runner.run_directory import (CONFIG_FILE, finished_checkpoint, policy_meta,
                                           run_directory_config)
from grpo_jax.runner.tokenizers import build_tokenizer, tokenizer_kind

# ModelConfig fields a config may override on top of config.model.name (None = the size's).
MODEL_SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "mlp_size", "rope_theta", "qkv_bias", "tie_embeddings", "rms_norm_eps",
                      "remat", "scan_layers", "attention")
# Of those, the fields of how the network is executed, not of its shape (a config may set
# them with model.init_from too).
EXECUTION_FIELDS = ("remat", "scan_layers", "attention")


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
        hf = load_json_file(os.path.join(init, "config.json"))
        return (config_from_hf(hf, dtype=config.model.dtype,
                               param_dtype=config.model.param_dtype, path=init),
                hf.get("model_type"))
    return model_config_for(config, tokenizer.vocab_size), None

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
    config = run_directory_config(workdir)
    if config is None:
        raise FileNotFoundError(f"{workdir}: not a grpo_jax run directory (no config.json "
                                "with stages and no checkpoints/)")
    if tokenizer is None:
        task = None if tokenizer_kind(config) == "checkpoint" else tasks_lib.task_of(
            config.task.name, config.task.kwargs.to_dict())[0]
        tokenizer = build_tokenizer(config, task, workdir)
    step, meta = finished_checkpoint(workdir, stage)
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
    path = config.model.init_from
    check_init_from(path)
    base = run_directory_config(path)
    if base is not None:
        try:
            base_task = tasks_lib.task_of(base.task.name, base.task.kwargs.to_dict())[0]
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

def check_checkpoint_files(config) -> None:
    """model.init_from's safetensors files are there and complete (their headers against
    their lengths: a download or copy cut short), before the workdir is touched: the Run
    reads the tensors only after creating it."""
    path = config.model.init_from
    if not path or run_directory_config(path) is not None:
        return
    try:
        check_tensor_files(path)
    except ValueError as err:
        raise ConfigError(f"model.init_from: {err}") from None
