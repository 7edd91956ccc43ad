"""Hugging Face checkpoints (Qwen2 / Llama) <-> the NNX Transformer, offline, via safetensors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from grpo_jax.json_files import load_json_file
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.transformer import Transformer

_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
_DTYPE_NAMES = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
}
_VALUE_HEAD_FILE = "value_head.safetensors"


def _model_type(hf: dict, path: Path) -> str:
    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    if model_type not in _ARCHITECTURES or any(
        a not in _ARCHITECTURES.values() for a in architectures
    ):
        raise ValueError(
            f"{path}/config.json: unsupported architecture model_type={model_type!r} "
            f"architectures={architectures}; supported: {sorted(_ARCHITECTURES)}"
        )
    return model_type


def dtype_name(dtype, *, what: str = "dtype") -> str:
    """A dtype given as a name ("bfloat16", "bf16", "torch.bfloat16") or a dtype object
    (jnp.bfloat16, np.dtype("float32")) as the ModelConfig name."""
    if not isinstance(dtype, str):
        try:
            dtype = jnp.dtype(dtype).name
        except TypeError:
            raise ValueError(f"{what}: {dtype!r} is not a dtype") from None
    name = dtype.replace("torch.", "")
    if name not in _DTYPE_NAMES:
        raise ValueError(f"{what}: {dtype!r} unsupported; expected one of "
                         f"{sorted(set(_DTYPE_NAMES.values()))}")
    return _DTYPE_NAMES[name]


def config_from_hf(hf: dict, *, dtype=None, param_dtype=None,
                   path: Path | str = "") -> ModelConfig:
    """Maps a transformers config.json dict (v4 or v5 layout) to a ModelConfig.

    `dtype` is the compute dtype and `param_dtype` the storage dtype (default: `dtype`);
    None uses the checkpoint's own dtype. Names and dtype objects are both accepted."""
    model_type = _model_type(hf, Path(path))
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"{path}/config.json: hidden_act={hf['hidden_act']!r} unsupported "
            "(SwiGLU with silu only)"
        )
    if hf.get("use_sliding_window"):
        raise ValueError(f"{path}/config.json: use_sliding_window=True is unsupported")
    if hf.get("mlp_bias"):
        raise ValueError(f"{path}/config.json: mlp_bias=True is unsupported")
    rope = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    scaling = {**legacy, **rope}
    rope_scaling = None
    if rope_type == "llama3":
        rope_scaling = (
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
            int(scaling["original_max_position_embeddings"]),
        )
    elif rope_type != "default":
        raise ValueError(
            f"{path}/config.json: rope type {rope_type!r} unsupported (default and llama3 only)"
        )
    heads = hf["num_attention_heads"]
    if dtype is None:
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    dtype = dtype_name(dtype, what=f"{path}: dtype")
    param_dtype = dtype if param_dtype is None else dtype_name(param_dtype,
                                                               what=f"{path}: param_dtype")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        mlp_size=hf["intermediate_size"],
        max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        qkv_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        dtype=dtype,
        param_dtype=param_dtype,
        rope_scaling=rope_scaling,
    )


def config_to_hf(config: ModelConfig, *, model_type: str = "qwen2") -> dict:
    """Maps a ModelConfig to a transformers config.json dict (readable by v4 and v5)."""
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"model_type {model_type!r} unsupported; expected one of {sorted(_ARCHITECTURES)}"
        )
    if model_type == "qwen2" and not config.qkv_bias:
        raise ValueError(
            "model_type='qwen2' needs qkv_bias=True; use model_type='llama' with "
            "attention_bias=False"
        )
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        factor, low, high, original = config.rope_scaling
        rope = {
            "rope_type": "llama3",
            "rope_theta": config.rope_theta,
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
        }
    hf = {
        "architectures": [_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.mlp_size,
        "max_position_embeddings": config.max_seq_len,
        "rope_theta": config.rope_theta,
        "rope_parameters": rope,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "torch_dtype": config.param_dtype,
        "dtype": config.param_dtype,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if model_type == "llama":
        hf.update(attention_bias=config.qkv_bias, mlp_bias=False)
    else:
        hf.update(use_sliding_window=False)
    if config.rope_scaling is not None:
        hf["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return hf


def _open(file: Path, framework: str):
    """safe_open, with a missing, truncated or foreign file as a ValueError naming it (the
    header is checked against the file's length, so a copy cut short fails here)."""
    if not file.is_file():
        raise ValueError(f"{file}: not found (listed in model.safetensors.index.json)")
    try:
        return safe_open(file, framework=framework)
    except Exception as err:  # noqa: BLE001  safetensors' SafetensorError is no ValueError
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"{file}: not a complete safetensors file ({reason}); the download "
                         "or copy was cut short or the file is not safetensors: copy it "
                         "again") from None


def _tensor_files(path: Path) -> dict[str, Path]:
    """Maps each tensor name to its safetensors file (single file or sharded with an index)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = load_json_file(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: expected a JSON object with a 'weight_map' object")
        return {name: path / file for name, file in weight_map.items()}
    single = path / "model.safetensors"
    if single.exists():
        with _open(single, "numpy") as f:
            return {name: single for name in f.keys()}
    raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json found")


def check_tensor_files(path) -> None:
    """Every safetensors file of a checkpoint directory is there and complete (its header
    reads and its data is as long as the header says), without reading the tensors; a
    ValueError naming the file otherwise. Cheap: the headers only."""
    path = Path(path)
    files = set(_tensor_files(path).values())
    if (path / _VALUE_HEAD_FILE).exists():
        files.add(path / _VALUE_HEAD_FILE)
    for file in sorted(files):
        with _open(file, "numpy"):
            pass


def _read_tensors(files: dict[str, Path]) -> dict[str, jax.Array]:
    tensors = {}
    for file in sorted(set(files.values())):
        with _open(file, "flax") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _layout(config: ModelConfig):
    """(hf name, our path, to_ours(hf array), to_hf(our array)) for every tensor."""
    d, n, k, h = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    same = (lambda w: w, lambda w: w)
    transposed = (lambda w: w.T, lambda w: w.T)

    def heads(count):  # hf [count * h, d] <-> our [d, count, h]
        return lambda w: w.T.reshape(d, count, h), lambda w: w.reshape(d, count * h).T

    def head_bias(count):  # hf [count * h] <-> our [count, h]
        return lambda w: w.reshape(count, h), lambda w: w.reshape(count * h)

    output = (lambda w: w.T.reshape(n, h, d), lambda w: w.reshape(n * h, d).T)
    entries = [
        ("model.embed_tokens.weight", ("embedding",), *same),
        ("model.norm.weight", ("final_norm", "scale"), *same),
    ]
    if not config.tie_embeddings:
        entries.append(("lm_head.weight", ("lm_head",), *transposed))
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        blk = ("blocks", i)
        entries += [
            (p + "input_layernorm.weight", blk + ("attention_norm", "scale"), *same),
            (p + "post_attention_layernorm.weight", blk + ("mlp_norm", "scale"), *same),
            (p + "self_attn.q_proj.weight", blk + ("attention", "q_kernel"), *heads(n)),
            (p + "self_attn.k_proj.weight", blk + ("attention", "k_kernel"), *heads(k)),
            (p + "self_attn.v_proj.weight", blk + ("attention", "v_kernel"), *heads(k)),
            (p + "self_attn.o_proj.weight", blk + ("attention", "o_kernel"), *output),
            (p + "mlp.gate_proj.weight", blk + ("mlp", "gate_kernel"), *transposed),
            (p + "mlp.up_proj.weight", blk + ("mlp", "up_kernel"), *transposed),
            (p + "mlp.down_proj.weight", blk + ("mlp", "down_kernel"), *transposed),
        ]
        if config.qkv_bias:
            entries += [(p + f"self_attn.{x}_proj.bias", blk + ("attention", f"{x}_bias"),
                         *head_bias(count)) for x, count in (("q", n), ("k", k), ("v", k))]
    return entries


def _variable(model: Transformer, path: tuple):
    node = model
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    return node


def _expected_hf_shape(config: ModelConfig, our_shape, to_hf) -> tuple:
    return tuple(to_hf(np.zeros(our_shape, np.int8)).shape)


def from_pretrained(path, *, dtype=None, param_dtype=None, value_head: bool | None = None):
    """Loads a local Qwen2 / Llama checkpoint directory into a Transformer.

    Args:
      path: directory with config.json and model.safetensors (or sharded *.safetensors with
        model.safetensors.index.json).
      dtype: compute dtype, a name ("bfloat16") or a dtype object (jnp.bfloat16); None uses
        the checkpoint's dtype.
      param_dtype: parameter storage dtype (e.g. float32 master weights under bfloat16
        compute); None: the same as `dtype`.
      value_head: add a value head (read from value_head.safetensors when present, else zeros);
        None adds one iff value_head.safetensors exists.

    Returns:
      (Transformer, ModelConfig).
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(
            f"{path}: config.json not found (expected a local Hugging Face checkpoint "
            "directory; download it beforehand, there is no network access at run time)"
        )
    hf = load_json_file(config_file)
    if not isinstance(hf, dict):
        raise ValueError(f"{config_file}: expected a JSON object, got {type(hf).__name__}")
    value_file = path / _VALUE_HEAD_FILE
    if value_head is None:
        value_head = value_file.exists()
    config = config_from_hf(hf, dtype=dtype, param_dtype=param_dtype, path=path)
    config = config.replace(value_head=value_head)
    files = _tensor_files(path)
    tensors = _read_tensors(files)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    layout = _layout(config)
    for hf_name, our_path, to_ours, to_hf in layout:
        variable = _variable(model, our_path)
        if hf_name not in tensors:
            raise ValueError(
                f"{path}: missing tensor {hf_name!r} (needed for {'/'.join(map(str, our_path))})"
            )
        expected = _expected_hf_shape(config, variable.value.shape, to_hf)
        if tuple(tensors[hf_name].shape) != expected:
            raise ValueError(
                f"{path}: tensor {hf_name!r} has shape {tuple(tensors[hf_name].shape)}, "
                f"expected {expected} from config.json"
            )
        variable.value = to_ours(jnp.asarray(tensors[hf_name])).astype(config.parameter_dtype)
    if value_head and not value_file.exists():  # a fresh critic on a pretrained policy
        model.value_kernel.value = jnp.zeros((config.hidden_size,), config.parameter_dtype)
        model.value_bias.value = jnp.zeros((), config.parameter_dtype)
    elif value_head:
        with _open(value_file, "flax") as f:
            model.value_kernel.value = f.get_tensor("value_head.weight").astype(
                config.parameter_dtype
            )
            model.value_bias.value = f.get_tensor("value_head.bias").astype(config.parameter_dtype)
    if config.tie_embeddings and "lm_head.weight" in tensors:
        if not np.allclose(
            np.asarray(tensors["lm_head.weight"], np.float32),
            np.asarray(tensors["model.embed_tokens.weight"], np.float32),
        ):
            raise ValueError(
                f"{path}: tie_word_embeddings=True but lm_head.weight differs from "
                "model.embed_tokens.weight"
            )
    return model, config


def save_pretrained(
    model: Transformer,
    config: ModelConfig,
    path,
    *,
    model_type: str | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Writes config.json and safetensors (sharded with an index past max_shard_bytes).

    Args:
      model: the Transformer.
      config: its ModelConfig.
      path: output directory (created).
      model_type: "qwen2" or "llama"; None picks qwen2 when qkv_bias else llama.
      max_shard_bytes: split the tensors into files of at most this many bytes (one tensor may
        exceed it alone); None writes a single model.safetensors.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if model_type is None:
        model_type = "qwen2" if config.qkv_bias else "llama"
    hf_config = config_to_hf(config, model_type=model_type)
    tensors = {}
    for hf_name, our_path, _, to_hf in _layout(config):
        tensors[hf_name] = np.asarray(to_hf(jnp.asarray(_variable(model, our_path).value)))
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = np.ascontiguousarray(array)
        size += array.nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata=metadata)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / file), metadata=metadata)
            weight_map.update({name: file for name in shard})
        index = {
            "metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))},
            "weight_map": weight_map,
        }
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    if config.value_head:
        save_file(
            {
                "value_head.weight": np.asarray(model.value_kernel.value),
                "value_head.bias": np.asarray(model.value_bias.value),
            },
            str(path / _VALUE_HEAD_FILE),
            metadata=metadata,
        )
    stale = (
        [path / "model.safetensors"] if len(shards) > 1 else [path / "model.safetensors.index.json"]
    )
    for file in stale:
        if file.exists():
            os.remove(file)
