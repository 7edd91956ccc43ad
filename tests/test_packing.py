"""Packed rows (`sft.data.pack_rows`, `pack_len`): several examples per row with attention,
positions and next-token targets kept per example give the unpacked rows' log-probs, loss
and update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.models import ModelConfig, Transformer, logprobs
from grpo_jax.sft.data import TokenBatch, pack_rows, packed_rows_for, packed_rows_needed
from grpo_jax.sft.loss import make_supervised_step
from grpo_jax.training import Policy, init_opt_state

CONFIG = ModelConfig(vocab_size=29, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, mlp_size=48, max_seq_len=32)
PAD = 0
jit_logprobs = nnx.jit(logprobs)


def examples(lengths, width, *, seed=0, loss_from=1):
    """Right-padded rows [n, width] of random tokens, as encode_pairs lays them out."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    batch = TokenBatch(tokens=np.full((n, width), PAD, np.int32),
                       attention_mask=np.zeros((n, width), bool),
                       loss_mask=np.zeros((n, width), bool))
    for i, length in enumerate(lengths):
        batch.tokens[i, :length] = rng.integers(1, CONFIG.vocab_size, length)
        batch.attention_mask[i, :length] = True
        batch.loss_mask[i, loss_from:length] = True
    return batch


def test_pack_rows_by_hand():
    batch = examples([3, 5, 2], 8)
    packed = pack_rows(batch, 2)
    # First fit decreasing: the 5 opens row 0, the 3 fills it, the 2 opens row 1.
    np.testing.assert_array_equal(packed.segment_ids,
                                  [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.positions,
                                  [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.tokens[0], np.r_[batch.tokens[1, :5],
                                                              batch.tokens[0, :3]])
    np.testing.assert_array_equal(packed.tokens[1, :2], batch.tokens[2, :2])
    assert (packed.tokens[1, 2:] == PAD).all()
    np.testing.assert_array_equal(packed.loss_mask[0], [0, 1, 1, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(packed.attention_mask, packed.segment_ids > 0)
    assert packed_rows_needed(batch.attention_mask.sum(1), 8) == 2
    assert packed_rows_needed(np.array([5, 4, 4, 3]), 8) == 2  # 5+3, 4+4
    assert packed_rows_for(np.array([5, 4, 4, 3, 8]), [[0, 1], [1, 2, 3, 4]], 8,
                           multiple=2) == 4  # 2 and 3 rows: the most, rounded up to 2
    with pytest.raises(ValueError, match="an example of 9 tokens does not fit a packed row "
                                         "of 8"):
        packed_rows_needed(np.array([9, 2]), 8)
    with pytest.raises(ValueError, match="3 examples need 2 packed rows of 8 tokens, more "
                                         "than the 1 allowed"):
        pack_rows(batch, 1)


def test_packed_logprobs_equal_each_example_alone():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    lengths = [7, 12, 3, 9, 5, 11, 4]
    batch = examples(lengths, 32)
    packed = pack_rows(batch, 3)
    # 51 tokens: two rows of several examples each, and a third of padding only.
    np.testing.assert_array_equal(packed.segment_ids.max(axis=1), [3, 4, 0])
    got = np.asarray(jit_logprobs(model, packed.tokens, packed.attention_mask,
                                  segment_ids=packed.segment_ids,
                                  positions=packed.positions)["logp"])
    # Each example in its own padded row.
    want = np.asarray(jit_logprobs(model, batch.tokens, batch.attention_mask)["logp"])
    found = []
    for row in range(3):
        for segment in range(1, packed.segment_ids[row].max() + 1):
            where = np.flatnonzero(packed.segment_ids[row] == segment)
            i = next(i for i, n in enumerate(lengths) if n == where.size and np.array_equal(
                batch.tokens[i, :n], packed.tokens[row, where]))
            found.append(i)
            np.testing.assert_allclose(got[row, where], want[i, :where.size], rtol=1e-5,
                                       atol=1e-6)
            assert got[row, where[0]] == 0.0  # a segment's first token is not predicted
    assert sorted(found) == list(range(len(lengths)))
    assert (got[packed.segment_ids == 0] == 0).all()


def test_packed_update_equals_the_unpacked_update():
    """One SGD step on 8 examples in 8 padded rows and in 4 packed rows: the same loss,
    gradient norm and parameters (token-mean over the same loss tokens). (Plain SGD: Adam's
    first step, g / (|g| + eps), turns float rounding in a near-zero gradient element into
    a visible difference, and did so on one machine's kernels.)"""
    model = Transformer(CONFIG, rngs=nnx.Rngs(1))
    policy, params = Policy.from_model(model)
    optimizer = optax.sgd(1.0)
    step = make_supervised_step(policy, optimizer)
    batch = examples([9, 14, 5, 12, 3, 2, 6, 4], 16, seed=3)
    packed = pack_rows(batch, 4)  # 55 tokens in 4 rows of 16
    results = []
    for rows in (batch, packed):
        state = jax.tree.map(jnp.copy, params)
        new, _, metrics = step(state, init_opt_state(optimizer, state), jax.device_put(rows))
        results.append((jax.device_get(new), jax.device_get(metrics)))
    (p_a, m_a), (p_b, m_b) = results
    assert m_a["grad_norm"] > 0
    np.testing.assert_allclose(m_b["loss"], m_a["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_b["grad_norm"], m_a["grad_norm"], rtol=1e-4)
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), p_a, params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the step changed the weights
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p_b, p_a)


def test_segment_ids_need_positions():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    tokens = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="segment_ids needs the packed rows' positions"):
        model.hidden_states(tokens, segment_ids=jnp.ones((1, 4), jnp.int32))


def test_a_row_longer_than_pack_len_is_one_line_naming_the_field(tmp_path):
    from configs import default as default_config
    from grpo_jax.pipeline import train_and_evaluate

    config = default_config.get_config("smoke")
    config.stages = "pretrain"
    config.mesh.num_devices = 1
    config.pretrain.pack_len = 16  # the smoke corpus has rows of 20-40 tokens
    with pytest.raises(ValueError, match=r"^pretrain\.pack_len: row \d+: \d+ tokens exceed the "
                                         r"sequence length 16 .*raise pack_len"):
        train_and_evaluate(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir())
