"""The analysis utilities of the "what is RL doing?" studies, against hand-computed values
and numpy: per-token KL and entropies, the share on high-entropy tokens, update sparsity and
effective rank."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.evals.token_analysis import (effective_rank, token_divergence, top_share,
                                           update_sparsity)
from grpo_jax.models import ModelConfig, Transformer
from grpo_jax.training import Policy


def _policy(seed):
    model = Transformer(ModelConfig(vocab_size=12, hidden_size=16, num_layers=1, num_heads=2,
                                    num_kv_heads=1, head_dim=8, mlp_size=32, max_seq_len=16),
                        rngs=nnx.Rngs(seed))
    return Policy.from_model(model)


def test_token_divergence_is_the_exact_kl_and_the_entropies():
    (policy, params), (_, other) = _policy(0), _policy(1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 12, (3, 7)).astype(np.int32)
    attention = np.ones((3, 7), bool)
    attention[2, 6] = False  # a completion one token shorter
    out = token_divergence(policy, params, other, tokens, attention, prompt_len=3, chunk=2)
    assert out["kl"].shape == (3, 4)
    same = token_divergence(policy, params, params, tokens, attention, prompt_len=3)
    np.testing.assert_allclose(same["kl"], 0.0, atol=1e-6)
    np.testing.assert_allclose(same["entropy"], same["base_entropy"], atol=1e-6)
    # by hand with numpy from the two models' logits
    p = np.asarray(jax.nn.log_softmax(policy.bind(params)(jnp.asarray(tokens),
                                                          attention_mask=jnp.asarray(attention)),
                                      -1))[:, 2:-1]
    q = np.asarray(jax.nn.log_softmax(policy.bind(other)(jnp.asarray(tokens),
                                                         attention_mask=jnp.asarray(attention)),
                                      -1))[:, 2:-1]
    kl = (np.exp(p) * (p - q)).sum(-1)
    keep = attention[:, 3:]
    np.testing.assert_allclose(out["kl"], np.where(keep, kl, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["entropy"], np.where(keep, -(np.exp(p) * p).sum(-1), 0),
                               rtol=1e-5)
    np.testing.assert_allclose(out["base_entropy"],
                               np.where(keep, -(np.exp(q) * q).sum(-1), 0), rtol=1e-5)
    assert out["kl"][2, 3] == 0.0 and (out["kl"][keep] > 0).all()


def test_top_share_by_hand():
    values = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 0.0, 99.0, 99.0]])
    scores = np.array([[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 9.0, 9.0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    # the top 0.2 of the six masked scores are 0.9 and 0.7 (at or above the 0.8 quantile)
    assert top_share(values, scores, mask, 0.2) == pytest.approx((2.0 + 10.0) / 20.0)
    assert top_share(values, scores, mask, 1.0) == pytest.approx(1.0)
    assert np.isnan(top_share(np.zeros((2, 4)), scores, mask))


def test_update_sparsity_and_effective_rank_by_hand():
    before = {"a": np.zeros((2, 3)), "b": {"c": np.ones(4)}}
    after = {"a": np.array([[0, 1e-6, 0.5], [0, 0, -2.0]]),
             "b": {"c": np.array([1.0, 1.0, 1.1, 1.0])}}
    out = update_sparsity(before, after, tol=1e-5)
    assert out["changed"] == pytest.approx(3 / 10)
    assert out["['a']"] == pytest.approx(2 / 6) and out["['b']['c']"] == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="shapes"):
        update_sparsity({"a": np.zeros(2)}, {"a": np.zeros(3)})
    assert effective_rank(np.eye(5)) == pytest.approx(5.0)
    assert effective_rank(np.outer([1.0, 2.0, 3.0], [4.0, 5.0])) == pytest.approx(1.0)
    assert effective_rank(np.zeros((3, 3))) == 0.0
    # singular values 3 and 1: p = (3/4, 1/4), exp(entropy)
    p = np.array([0.75, 0.25])
    assert effective_rank(np.diag([3.0, 1.0])) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
