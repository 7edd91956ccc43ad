"""Parity of from_pretrained / save_pretrained with transformers, and HFTokenizer."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.models import ModelConfig, Transformer, from_pretrained, save_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOKENS = np.array([[0, 0, 5, 17, 3, 44, 9, 12], [1, 2, 3, 4, 5, 6, 7, 8]])
MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8], bool)


def hf_logits(hf_model, tokens=TOKENS, mask=MASK):
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(int)),
            position_ids=torch.tensor(positions),
        )
    return out.logits.float().numpy()


def our_logits(model, tokens=TOKENS, mask=MASK):
    return np.asarray(model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))


def tiny_hf(kind, **extra):
    torch.manual_seed(0)
    common = dict(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        **extra,
    )
    if kind == "qwen2":
        config = transformers.Qwen2Config(rope_theta=1e4 * 3, **common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # random biases / norm scales so every tensor matters
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model.float().eval()


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("qwen2", dict(tie_word_embeddings=True)),
        ("qwen2", dict(tie_word_embeddings=False)),
        ("llama", dict(tie_word_embeddings=False)),
        (
            "llama",
            dict(
                tie_word_embeddings=True,
                rope_scaling=dict(
                    rope_type="llama3",
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position_embeddings=16,
                ),
            ),
        ),
    ],
)
def test_from_pretrained_matches_transformers(tmp_path, kind, extra):
    hf_model = tiny_hf(kind, **extra)
    hf_model.save_pretrained(tmp_path / "ckpt")
    model, config = from_pretrained(tmp_path / "ckpt", dtype="float32")
    assert config.qkv_bias == (kind == "qwen2")
    assert config.tie_embeddings == extra["tie_word_embeddings"]
    if "rope_scaling" in extra:
        assert config.rope_scaling == (8.0, 1.0, 4.0, 16)
    expected = hf_logits(hf_model)
    np.testing.assert_allclose(
        our_logits(model) * MASK[..., None], expected * MASK[..., None], atol=2e-5, rtol=1e-4
    )

    # Export (sharded) -> transformers load -> the same logits.
    save_pretrained(model, config, tmp_path / "export", max_shard_bytes=20_000)
    assert (tmp_path / "export" / "model.safetensors.index.json").exists()
    auto = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "export", dtype=torch.float32
    ).eval()
    assert type(auto).__name__ == type(hf_model).__name__
    np.testing.assert_allclose(
        hf_logits(auto) * MASK[..., None], expected * MASK[..., None], atol=2e-5, rtol=1e-4
    )
    # And our own loader reads the sharded export back identically.
    again, config_again = from_pretrained(tmp_path / "export")
    assert config_again == config
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(a, b)


def test_value_head_and_bfloat16_round_trip(tmp_path):
    config = ModelConfig(
        vocab_size=40,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_size=24,
        qkv_bias=True,
        value_head=True,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    model = Transformer(config, rngs=nnx.Rngs(1))
    model.value_kernel.value = jnp.arange(16, dtype=jnp.bfloat16)
    save_pretrained(model, config, tmp_path)
    loaded, loaded_config = from_pretrained(tmp_path)
    assert loaded_config == config
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        assert a.dtype == b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    # Fresh critic on a checkpoint without one: zeros.
    (tmp_path / "value_head.safetensors").unlink()
    fresh, fresh_config = from_pretrained(tmp_path, dtype="float32", value_head=True)
    assert fresh_config.value_head and fresh_config.dtype == "float32"
    np.testing.assert_array_equal(fresh.value_kernel.value, 0.0)
    expected = hf_logits(auto.eval(), TOKENS % 40)
    np.testing.assert_allclose(
        our_logits(fresh, TOKENS % 40) * MASK[..., None],
        expected * MASK[..., None],
        atol=2e-5,
        rtol=1e-4,
    )


def test_errors_name_the_tensor_or_field(tmp_path):
    hf_model = tiny_hf("qwen2", tie_word_embeddings=False)
    hf_model.save_pretrained(tmp_path)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    original = dict(tensors)

    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        from_pretrained(tmp_path)

    tensors = dict(original)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"'model.layers.0.self_attn.k_proj.weight' has shape "
        r"\(8, 32\), expected \(16, 32\)",
    ):
        from_pretrained(tmp_path)

    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**hf, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ValueError, match="unsupported architecture model_type='gpt2'"):
        from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="config.json not found"):
        from_pretrained(tmp_path / "nowhere")
