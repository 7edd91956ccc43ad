"""Model configuration: one frozen dataclass and a table of named sizes."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")
# ModelConfig.attention (see `grpo_jax.models.transformer.attend`).
ATTENTION_IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen2 / Llama-family decoder (hashable, usable as a jit static).

    Attributes:
      vocab_size: number of token ids V.
      hidden_size: residual width D.
      num_layers: number of decoder blocks L.
      num_heads: query heads N.
      num_kv_heads: key/value heads K (grouped-query attention; N % K == 0).
      head_dim: per-head width H.
      mlp_size: SwiGLU inner width F.
      max_seq_len: longest sequence (prompt + completion) the model is used with.
      rope_theta: rotary base; inverse frequencies theta^(-2i/H).
      qkv_bias: add biases to the q/k/v projections (Qwen2: True, Llama: False).
      tie_embeddings: output head is the transposed token embedding.
      rms_norm_eps: epsilon inside RMSNorm's rsqrt.
      dtype: compute dtype name ("float32" | "bfloat16" | "float16").
      param_dtype: parameter storage dtype name.
      remat: rematerialise each block in the backward pass (jax.checkpoint).
      attention: the teacher-forced passes' attention (`transformer.attend`): "einsum",
        "xla" or "cudnn" (`jax.nn.dot_product_attention`), or "auto" (cuDNN's fused attention
        on a GPU in a 16-bit dtype, else "einsum"). The sampler's cached decode attention is
        the same everywhere.
      scan_layers: run the blocks of the teacher-forced passes as one `lax.scan` over their
        stacked weights (compiled once, not L times; under FSDP each layer's weights are
        gathered inside the loop). The parameters keep one subtree per block; the stack is
        built inside the program, a transient copy of the block weights (and of their
        gradients). The sampler's decode step stays unrolled.
      value_head: add a scalar value head V(s_t) = w . h_t + b (PPO critic).
      rope_scaling: None, or Llama-3 frequency scaling as
        (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_size: int
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    tie_embeddings: bool = True
    rms_norm_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    scan_layers: bool = False
    attention: str = "auto"
    value_head: bool = False
    rope_scaling: tuple[float, float, float, int] | None = None

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim={self.head_dim} must be even for rotary embeddings"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r}; expected one of {_DTYPES}"
                )
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"ModelConfig.attention={self.attention!r}; expected one of "
                             f"{ATTENTION_IMPLEMENTATIONS}")
        if self.attention == "cudnn" and self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"ModelConfig.attention='cudnn' needs dtype bfloat16 or float16 "
                             f"(cuDNN's fused attention), got {self.dtype!r}")
        if self.rope_scaling is not None and len(self.rope_scaling) != 4:
            raise ValueError(
                "ModelConfig.rope_scaling must be (factor, low_freq_factor, "
                f"high_freq_factor, original_max_position_embeddings), got "
                f"{self.rope_scaling!r}"
            )

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def parameter_dtype(self) -> Any:
        return jnp.dtype(self.param_dtype)

    def replace(self, **overrides) -> ModelConfig:
        return dataclasses.replace(self, **overrides)

    def num_params(self) -> int:
        """Parameter count implied by the shapes (value head included when enabled)."""
        d, n, k, h, f = (
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.mlp_size,
        )
        attention = d * n * h + 2 * d * k * h + n * h * d
        if self.qkv_bias:
            attention += n * h + 2 * k * h
        block = attention + 3 * d * f + 2 * d
        total = self.num_layers * block + self.vocab_size * d + d
        if not self.tie_embeddings:
            total += d * self.vocab_size
        if self.value_head:
            total += d + 1
        return total


# What the Qwen2.5 models share (their config.json files); each size adds its shape.
_QWEN2_5 = dict(vocab_size=151936, num_kv_heads=2, max_seq_len=32768, rope_theta=1000000.0,
                qkv_bias=True, tie_embeddings=True, rms_norm_eps=1e-6, dtype="bfloat16",
                param_dtype="bfloat16")

# What the tiny models share (the synthetic tasks use small character vocabularies); each
# size adds its shape.
_TINY = dict(vocab_size=64, head_dim=32)

_NAMED = {
    # ~0.3M parameters at vocab 64: a student a quarter of tiny-1m's size (distillation
    # studies: a small pretrained student and a larger RL-trained teacher).
    "tiny-300k": dict(_TINY, hidden_size=96, num_layers=2, num_heads=3, num_kv_heads=1,
                      mlp_size=384, max_seq_len=512),
    # ~1.0M parameters at vocab 64.
    "tiny-1m": dict(_TINY, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                    mlp_size=512, max_seq_len=512),
    # ~9.9M parameters at vocab 64.
    "tiny-10m": dict(_TINY, hidden_size=256, num_layers=10, num_heads=8, num_kv_heads=4,
                     mlp_size=1024, max_seq_len=1024),
    # Shapes from the released config.json files on the Hugging Face hub.
    "qwen2.5-0.5b": dict(_QWEN2_5, hidden_size=896, num_layers=24, num_heads=14, head_dim=64,
                         mlp_size=4864),
    "qwen2.5-1.5b": dict(_QWEN2_5, hidden_size=1536, num_layers=28, num_heads=12,
                         head_dim=128, mlp_size=8960),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, mlp_size=8192, max_seq_len=131072,
                         rope_theta=500000.0, qkv_bias=False, tie_embeddings=True,
                         rms_norm_eps=1e-5, dtype="bfloat16", param_dtype="bfloat16",
                         rope_scaling=(32.0, 1.0, 4.0, 8192)),
}


def available_models() -> list[str]:
    """Names accepted by `named_config`."""
    return sorted(_NAMED)


def named_config(name: str, **overrides) -> ModelConfig:
    """Returns the named ModelConfig with field overrides (e.g. vocab_size=48, remat=True).

    Args:
      name: one of "tiny-300k", "tiny-1m", "tiny-10m", "qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b".
      **overrides: ModelConfig fields to replace.

    Returns:
      The ModelConfig.
    """
    if name not in _NAMED:
        raise ValueError(f"unknown model name {name!r}; expected one of {sorted(_NAMED)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown ModelConfig field(s) {unknown} in overrides for {name!r}")
    return ModelConfig(**{**_NAMED[name], **overrides})
