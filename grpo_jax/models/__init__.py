"""Flax NNX decoder-only transformer (Qwen2 / Llama family), KV cache, value head, HF I/O.

Logical axis names carried by the parameters (read them with
`nnx.get_partition_spec(nnx.state(model))`; grpo_jax.parallel maps them to the mesh axes
"data", "fsdp", "tensor"). Variables are created with `eager_sharding=False`, so a model
can be built without a mesh; shard the state afterwards with the rules.

    embedding            [V, D]     ("vocab", "embed")
    lm_head (untied)     [D, V]     ("embed", "vocab")
    q_kernel             [D, N, H]  ("embed", "heads", "head_dim")
    k_kernel, v_kernel   [D, K, H]  ("embed", "kv_heads", "head_dim")
    o_kernel             [N, H, D]  ("heads", "head_dim", "embed")
    q_bias               [N, H]     ("heads", "head_dim")
    k_bias, v_bias       [K, H]     ("kv_heads", "head_dim")
    gate_kernel, up_kernel [D, F]   ("embed", "mlp")
    down_kernel          [F, D]     ("mlp", "embed")
    RMSNorm scale        [D]        ("norm",)
    value_kernel         [D]        ("embed",);  value_bias [] ()

A typical rule set: embed -> "fsdp", vocab/heads/kv_heads/mlp -> "tensor", head_dim/norm ->
None (replicated).
"""

from grpo_jax.models.config import ModelConfig, available_models, named_config
from grpo_jax.models.transformer import (
    KVCache,
    Transformer,
    apply_rope,
    attend,
    completion_logprobs,
    default_positions,
    entropy_of,
    logprobs,
    rope_inverse_frequencies,
    target_logp,
)

__all__ = [
    "KVCache",
    "ModelConfig",
    "Transformer",
    "apply_rope",
    "attend",
    "completion_logprobs",
    "default_positions",
    "entropy_of",
    "logprobs",
    "available_models",
    "named_config",
    "rope_inverse_frequencies",
    "target_logp",
]

from grpo_jax.models.hf import (
    config_from_hf,
    config_to_hf,
    from_pretrained,
    save_pretrained,
)

__all__ += ["config_from_hf", "config_to_hf", "from_pretrained", "save_pretrained"]
