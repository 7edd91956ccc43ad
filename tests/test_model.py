"""Tests for grpo_jax.models: shapes, masking, RoPE identities, chunked logprobs, KV cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.models import (
    ModelConfig,
    Transformer,
    apply_rope,
    completion_logprobs,
    logprobs,
    named_config,
    rope_inverse_frequencies,
)

jit_logprobs = nnx.jit(logprobs, static_argnames=("chunk_size", "return_entropy", "return_values"))

SMALL = dict(
    vocab_size=37,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_size=48,
    max_seq_len=64,
)


def make(seed=0, **overrides):
    config = ModelConfig(**{**SMALL, **overrides})
    return Transformer(config, rngs=nnx.Rngs(seed)), config


def test_named_configs_param_counts():
    for name, low, high in [("tiny-300k", 0.25e6, 0.35e6), ("tiny-1m", 0.8e6, 1.2e6),
                            ("tiny-10m", 8e6, 12e6)]:
        config = named_config(name)
        model = Transformer(config, rngs=nnx.Rngs(0))
        count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert count == config.num_params()
        assert low < count < high
    assert named_config("tiny-1m", vocab_size=48).vocab_size == 48
    # Qwen2.5-0.5B has 494,032,768 parameters (model card); the count from shapes must agree.
    assert named_config("qwen2.5-0.5b").num_params() == 494_032_768
    # Llama-3.2-1B: 1,235,814,400 parameters (tied head).
    assert named_config("llama-3.2-1b").num_params() == 1_235_814_400


def test_config_errors():
    with pytest.raises(ValueError, match="unknown model name"):
        named_config("gpt-5")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        named_config("tiny-1m", hidden=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(**{**SMALL, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(**{**SMALL, "dtype": "float64"})


def test_logical_axis_names():
    model, _ = make(qkv_bias=True, tie_embeddings=False, value_head=True)
    names = lambda variable: tuple(variable.get_metadata()["out_sharding"])
    attention, mlp = model.blocks[0].attention, model.blocks[0].mlp
    assert names(model.embedding) == ("vocab", "embed")
    assert names(model.lm_head) == ("embed", "vocab")
    assert names(attention.q_kernel) == ("embed", "heads", "head_dim")
    assert names(attention.k_kernel) == ("embed", "kv_heads", "head_dim")
    assert names(attention.o_kernel) == ("heads", "head_dim", "embed")
    assert names(attention.q_bias) == ("heads", "head_dim")
    assert names(mlp.gate_kernel) == ("embed", "mlp")
    assert names(mlp.down_kernel) == ("mlp", "embed")
    assert names(model.final_norm.scale) == ("norm",)
    specs = jax.tree.leaves(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert len(specs) == len(params)
    assert all(len(spec) == p.ndim for spec, p in zip(specs, params))


def test_rope_identities():
    config = ModelConfig(**SMALL)
    inv_freq = rope_inverse_frequencies(config)
    np.testing.assert_allclose(inv_freq, 10000.0 ** (-np.arange(0, 8, 2) / 8))
    x = jax.random.normal(jax.random.key(0), (1, 1, 1, 8))
    y = jax.random.normal(jax.random.key(1), (1, 1, 1, 8))
    np.testing.assert_allclose(apply_rope(x, jnp.zeros((1, 1), int), inv_freq), x, atol=1e-7)
    # <R_m x, R_n y> depends only on m - n.
    dot = lambda m, n: float(
        jnp.sum(
            apply_rope(x, jnp.full((1, 1), m), inv_freq)
            * apply_rope(y, jnp.full((1, 1), n), inv_freq)
        )
    )
    assert dot(7, 3) == pytest.approx(dot(14, 10), rel=1e-5)
    assert dot(7, 3) != pytest.approx(dot(7, 4), rel=1e-3)
    # Rotation preserves norms.
    np.testing.assert_allclose(
        jnp.linalg.norm(apply_rope(x, jnp.full((1, 1), 5), inv_freq)), jnp.linalg.norm(x), rtol=1e-6
    )


def test_causal_and_left_padding_invariance():
    model, config = make()
    tokens = jnp.array([[3, 9, 4, 1, 7, 2]])
    logits = model(tokens)
    changed = model(tokens.at[0, 4].set(11))
    np.testing.assert_allclose(changed[:, :4], logits[:, :4], atol=1e-6)
    assert not np.allclose(changed[:, 4:], logits[:, 4:], atol=1e-4)
    padded = jnp.concatenate([jnp.zeros((1, 3), int), tokens], axis=1)
    mask = jnp.arange(9)[None] >= 3
    padded_logits = model(padded, attention_mask=mask)
    np.testing.assert_allclose(padded_logits[:, 3:], logits, atol=1e-5)


def test_logprobs_match_independent_log_softmax_and_chunking():
    model, config = make(tie_embeddings=False)
    tokens = jax.random.randint(jax.random.key(2), (3, 11), 1, config.vocab_size)
    mask = jnp.arange(11)[None] >= jnp.array([[0], [2], [5]])
    full = nnx.jit(lambda m, t, a: m(t, attention_mask=a))(model, tokens, mask)
    log_probs = jax.nn.log_softmax(full, axis=-1)
    expected = jnp.take_along_axis(log_probs[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    expected = jnp.where(mask[:, 1:] & mask[:, :-1], expected, 0)
    entropy = jnp.where(
        mask[:, 1:] & mask[:, :-1], -jnp.sum(jnp.exp(log_probs) * log_probs, -1)[:, :-1], 0
    )
    for chunk_size in (None, 3, 4, 100):
        out = jit_logprobs(model, tokens, mask, chunk_size=chunk_size, return_entropy=True)
        np.testing.assert_allclose(out["logp"][:, 1:], expected, atol=1e-5)
        np.testing.assert_allclose(out["entropy"][:, 1:], entropy, atol=1e-5)
        assert np.all(out["logp"][:, 0] == 0)
        assert np.all(out["logp"][2, :6] == 0)  # row 2 is padded up to t=5, first real logp at 6

    def loss(model, chunk_size):
        return jnp.sum(logprobs(model, tokens, mask, chunk_size=chunk_size)["logp"])

    grad_fn = nnx.jit(nnx.grad(loss), static_argnums=1)
    grads_full = grad_fn(model, None)
    grads_chunk = grad_fn(model, 4)
    for a, b in zip(jax.tree.leaves(grads_full), jax.tree.leaves(grads_chunk)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("remat,layouts", [(False, ((1, None), (2, None), (4, 4))),
                                           (True, ((4, None),))])
def test_completion_logprobs_with_shared_prompts_match_logprobs(remat, layouts):
    """The completions' log-probs and entropies, their gradients, with each prompt run once
    per group of G rows (G = 1, 2, 4 of 8 rows) or not: those of `logprobs` sliced at the
    prompt length. Left-padded prompts, padded completions, temperature, chunking, remat."""
    model, config = make(tie_embeddings=False, remat=remat)
    rng = np.random.default_rng(4)
    groups, g, p, c = 2, 4, 5, 6
    prompts = np.repeat(rng.integers(1, config.vocab_size, (groups, p)), g, 0)
    prompt_mask = np.repeat(np.arange(p)[None] >= np.array([[0], [2]]), g, 0)
    completion_mask = np.arange(c)[None] < rng.integers(0, c + 1, (groups * g, 1))
    tokens = jnp.asarray(np.concatenate(
        [prompts, rng.integers(1, config.vocab_size, (groups * g, c))], 1))
    mask = jnp.asarray(np.concatenate([prompt_mask, completion_mask], 1))
    weights = jnp.asarray(rng.normal(size=(groups * g, c)), jnp.float32)

    def sliced(model):
        out = logprobs(model, tokens, mask, return_entropy=True, temperature=0.7)
        return out["logp"][:, p:], out["entropy"][:, p:]

    def shared(model, group, chunk_size=None):
        out = completion_logprobs(model, tokens, mask, p, group_size=group, chunk_size=chunk_size,
                                  return_entropy=True, temperature=0.7)
        return out["logp"], out["entropy"]

    def loss(model, fn):
        logp, entropy = fn(model)
        return jnp.sum(logp * weights) + jnp.sum(entropy)

    expected = nnx.jit(sliced)(model)
    assert np.any(expected[0] != 0) and np.any(expected[0] == 0)  # padded completions
    grad = nnx.jit(nnx.grad(loss), static_argnums=1)
    expected_grads = jax.tree.leaves(grad(model, sliced))
    for group, chunk_size in layouts:
        fn = lambda m, group=group, chunk_size=chunk_size: shared(m, group, chunk_size)  # noqa
        got = nnx.jit(fn)(model)
        np.testing.assert_allclose(got[0], expected[0], atol=2e-6, err_msg=f"G={group}")
        np.testing.assert_allclose(got[1], expected[1], atol=2e-6, err_msg=f"G={group}")
        for a, b in zip(expected_grads, jax.tree.leaves(grad(model, fn))):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=f"G={group}")


@pytest.mark.parametrize("execution", [dict(scan_layers=True),
                                       dict(scan_layers=True, remat=True),
                                       dict(attention="xla")])
def test_execution_variants_equal_the_plain_model(execution):
    """scan_layers (the blocks as one scan over in-program stacked weights, with or without
    remat) and attention through `jax.nn.dot_product_attention` compute the same function:
    the same log-probs, entropies and gradients for left-padded full sequences, shared
    prompts and packed rows; the parameter tree is unchanged."""
    unrolled, config = make(tie_embeddings=False, remat=execution.get("remat", False),
                            num_layers=3)
    scanned, _ = make(tie_embeddings=False, num_layers=3, **execution)
    assert jax.tree.structure(nnx.state(unrolled)) == jax.tree.structure(nnx.state(scanned))
    rng = np.random.default_rng(7)
    prompts = np.repeat(rng.integers(1, config.vocab_size, (2, 4)), 2, 0)
    tokens = jnp.asarray(np.concatenate(
        [prompts, rng.integers(1, config.vocab_size, (4, 5))], 1))
    mask = jnp.asarray(np.arange(9)[None] >= np.array([[0], [0], [2], [2]]))
    segments = jnp.asarray(np.repeat([[0] * 4 + [1] * 5], 4, 0))
    positions = jnp.asarray(np.repeat([list(range(4)) + list(range(5))], 4, 0))

    def loss(model):
        full = logprobs(model, tokens, mask, return_entropy=True)
        shared = completion_logprobs(model, tokens, mask, 4, group_size=2, chunk_size=2)
        packed = logprobs(model, tokens, jnp.ones_like(mask), segment_ids=segments,
                          positions=positions)
        total = (jnp.sum(full["logp"]) + jnp.sum(full["entropy"]) + jnp.sum(shared["logp"])
                 + jnp.sum(packed["logp"]))
        return total, (full["logp"], shared["logp"], packed["logp"])

    fn = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    (_, expected), expected_grads = fn(unrolled)
    (_, got), grads = fn(scanned)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=2e-6)
    leaves = jax.tree.leaves(nnx.to_pure_dict(expected_grads))
    assert all(np.any(leaf != 0) for leaf in leaves[:3])
    for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(grads)), leaves):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_head_tiles_of_rows_and_positions_give_the_same_logprobs_and_gradients():
    model, config = make(tie_embeddings=False)
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(1, config.vocab_size, (6, 9)))
    mask = jnp.asarray(np.arange(9)[None] >= rng.integers(0, 3, (6, 1)))

    def loss(model, chunk_size, chunk_rows):
        tiles = dict(chunk_size=chunk_size, chunk_rows=chunk_rows)
        out = logprobs(model, tokens, mask, return_entropy=True, **tiles)
        part = completion_logprobs(model, tokens, mask, 4, group_size=1, **tiles)
        return jnp.sum(out["logp"]) + jnp.sum(out["entropy"]) + jnp.sum(part["logp"]), (
            out["logp"], out["entropy"], part["logp"])

    grad = nnx.jit(nnx.grad(loss, has_aux=True), static_argnums=(1, 2))
    expected_grads, expected = grad(model, None, None)
    for tiles in ((3, 2), (None, 3), (4, 4)):  # 4 does not divide 6 rows: all rows
        grads, got = grad(model, *tiles)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, atol=2e-6, err_msg=str(tiles))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=str(tiles))


def test_attention_implementation_choice():
    from grpo_jax.models.transformer import attention_implementation

    assert attention_implementation("auto", jnp.float32) == "einsum"
    if jax.default_backend() != "gpu":
        assert attention_implementation("auto", jnp.bfloat16) == "einsum"
    assert attention_implementation("xla", jnp.float32) == "xla"
    with pytest.raises(ValueError, match="needs dtype bfloat16 or float16"):
        ModelConfig(**{**SMALL, "attention": "cudnn"})
    with pytest.raises(ValueError, match="attention='flash'; expected one of"):
        ModelConfig(**{**SMALL, "attention": "flash"})


def test_completion_logprobs_errors():
    model, _ = make()
    tokens, mask = jnp.ones((6, 8), jnp.int32), jnp.ones((6, 8), bool)
    with pytest.raises(ValueError, match="group_size 4 does not divide the batch of 6 rows"):
        completion_logprobs(model, tokens, mask, 3, group_size=4)
    with pytest.raises(ValueError, match=r"prefix_len must be in \(0, 8\), got 8"):
        completion_logprobs(model, tokens, mask, 8)
    with pytest.raises(ValueError, match="equal shape"):
        completion_logprobs(model, tokens, mask[:, :5], 3)


def test_remat_same_gradients_and_value_head():
    tokens = jax.random.randint(jax.random.key(3), (2, 7), 0, 37)
    mask = jnp.ones((2, 7), bool)

    def loss(model):
        out = jit_logprobs(model, tokens, mask, return_values=True)
        return jnp.sum(out["logp"]) + jnp.sum(out["values"] ** 2)

    plain, _ = make(value_head=True)
    remat, _ = make(value_head=True, remat=True)
    grad_fn = nnx.jit(nnx.grad(loss))
    for a, b in zip(jax.tree.leaves(grad_fn(plain)), jax.tree.leaves(grad_fn(remat))):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Value head: zero at init; equals w . h + b once set.
    out = logprobs(plain, tokens, mask, return_values=True)
    np.testing.assert_array_equal(out["values"], 0.0)
    plain.value_kernel.value = jnp.arange(32, dtype=jnp.float32) / 32
    plain.value_bias.value = jnp.array(0.5)
    hidden = plain.hidden_states(tokens, attention_mask=mask)
    expected = hidden @ (jnp.arange(32) / 32) + 0.5
    np.testing.assert_allclose(
        logprobs(plain, tokens, mask, return_values=True)["values"], expected, atol=1e-5
    )
    no_values, _ = make()
    with pytest.raises(ValueError, match="value_head"):
        logprobs(no_values, tokens, mask, return_values=True)


def test_bfloat16_compute_gives_float32_logits_close_to_float32():
    model32, _ = make()
    model16, _ = make(dtype="bfloat16")  # same float32 parameters, bfloat16 compute
    tokens = jnp.array([[1, 5, 9, 2, 4]])
    logits16 = model16(tokens)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, model32(tokens), atol=5e-2)


def test_cached_decode_matches_full_forward():
    model, config = make(qkv_bias=True)
    # Make q/k/v biases non-zero so they are exercised.
    for block in model.blocks:
        block.attention.k_bias.value = jnp.full(block.attention.k_bias.value.shape, 0.3)
    batch, prompt_len, new = 3, 5, 6
    tokens = jax.random.randint(jax.random.key(4), (batch, prompt_len + new), 1, config.vocab_size)
    prompt_mask = jnp.arange(prompt_len)[None] >= jnp.array([[0], [2], [4]])
    mask = jnp.concatenate([prompt_mask, jnp.ones((batch, new), bool)], axis=1)
    full = model(tokens, attention_mask=mask)

    cache = model.init_cache(batch, prompt_len + new)
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    hidden, cache = model.decode(tokens[:, :prompt_len], positions, prompt_mask, cache)
    cached = [model.logits(hidden)]
    next_position = prompt_mask.sum(axis=1)
    for t in range(new):
        hidden, cache = model.decode(
            tokens[:, prompt_len + t : prompt_len + t + 1],
            (next_position + t)[:, None],
            jnp.ones((batch, 1), bool),
            cache,
        )
        cached.append(model.logits(hidden))
    cached = jnp.concatenate(cached, axis=1)
    np.testing.assert_allclose(
        cached * mask[..., None], full * mask[..., None], atol=2e-5, rtol=1e-5
    )
    assert int(cache.index) == prompt_len + new
