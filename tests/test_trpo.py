"""TRPO: the natural-gradient step respects the KL bound after the line search; one stage step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import losses
from grpo_jax.models import Transformer, named_config
from grpo_jax.rl import trpo
from grpo_jax.rl.rollout import Rollout
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS, default_section
from grpo_jax.training import Policy

from configs import default as default_config


def _batch(rows=8, prompt_len=3, new=5, vocab=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, vocab, (rows, prompt_len + new)), jnp.int32)
    lengths = rng.integers(1, new + 1, rows)
    completion_mask = jnp.asarray(np.arange(new)[None] < lengths[:, None])
    rewards = jnp.asarray(rng.integers(0, 2, rows), jnp.float32)
    batch = Rollout(prompt_tokens=tokens[:, :prompt_len],
                    prompt_mask=jnp.ones((rows, prompt_len), bool),
                    tokens=tokens[:, prompt_len:], attention_mask=completion_mask,
                    loss_mask=completion_mask,
                    behaviour_logp=jnp.zeros((rows, new), jnp.float32), rewards=rewards,
                    version=0).to_batch()
    return batch.with_advantages(losses.group_advantages(rewards, group_size=4))


def _tiny_policy():
    """A one-block model over the 12-token vocabulary of `_batch` (policy, params)."""
    config = named_config("tiny-1m", vocab_size=12, hidden_size=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16, mlp_size=64, max_seq_len=16)
    return Policy.from_model(Transformer(config, rngs=nnx.Rngs(0)))


def _exact_mean_kl(policy, old, new, batch, prompt_len):
    """Independent KL(pi_old || pi_new) per valid completion token, in float64 numpy."""
    def log_softmax(params):
        logits = np.asarray(trpo.completion_logits(policy, params, batch.tokens,
                                                   batch.attention_mask, prompt_len),
                            np.float64)
        logits = logits - logits.max(-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    lp_old, lp_new = log_softmax(old), log_softmax(new)
    kl = (np.exp(lp_old) * (lp_old - lp_new)).sum(-1)
    m = np.asarray(batch.loss_mask)
    return kl[m].mean()


def test_trpo_step_keeps_kl_within_bound_and_improves():
    max_kl = 1e-3
    policy, params = _tiny_policy()
    batch = _batch()
    step = trpo.make_trpo_step(policy, prompt_len=3, max_kl=max_kl, damping=0.01, cg_iters=10)
    new_params, m = jax.device_get(step(params, batch))
    assert m["accepted"] == 1.0
    measured = _exact_mean_kl(policy, params, new_params, batch, 3)
    assert 0.0 < measured <= max_kl * (1 + 1e-4)
    np.testing.assert_allclose(m["kl_step"], measured, rtol=1e-3)
    # The accepted step improves the surrogate (ratio-weighted advantage) over theta_old.
    surrogate, _ = trpo.trpo_objectives(policy, params, batch, prompt_len=3)
    gain = float(surrogate(new_params) - surrogate(params))
    assert gain > 0 and gain == pytest.approx(float(m["surrogate_gain"]), rel=1e-3)
    # The full natural step sits on the quadratic trust-region boundary, so the first
    # candidate's KL is close to max_kl (second-order accurate for small max_kl).
    if m["step_fraction"] == 1.0:
        assert measured == pytest.approx(max_kl, rel=0.3)


def test_fisher_rows_spread_over_the_batch():
    assert trpo.fisher_rows(8, 1.0) is None
    np.testing.assert_array_equal(trpo.fisher_rows(8, 0.5), [0, 2, 5, 7])
    rows = trpo.fisher_rows(256, 0.2)
    assert len(rows) == 51 and rows[0] == 0 and rows[-1] == 255
    assert len(set(rows // 8)) >= 30  # spread over 30+ of the 32 prompt groups of 8
    assert list(trpo.fisher_rows(4, 0.01)) == [0]
    with pytest.raises(ValueError, match="fisher_fraction must be in"):
        trpo.fisher_rows(8, 0.0)


def test_trpo_step_on_a_fisher_subsample_is_the_natural_step_of_that_subsample():
    # expected_gain = g.d: g from every row, d = the natural step under the Fisher of the
    # subsample's rows only; computed here by forward-over-reverse on the subsample's KL.
    policy, params = _tiny_policy()
    batch = _batch()
    step = trpo.make_trpo_step(policy, prompt_len=3, max_kl=1e-3, damping=0.01, cg_iters=10,
                               fisher_fraction=0.5)
    _, m = jax.device_get(step(params, batch))
    rows = trpo.fisher_rows(8, 0.5)
    sub = jax.tree.map(lambda x: x[rows] if getattr(x, "ndim", 0) else x, batch)
    surrogate, _ = trpo.trpo_objectives(policy, params, batch, prompt_len=3)
    _, sub_kl = trpo.trpo_objectives(policy, params, sub, prompt_len=3)
    grad = jax.grad(surrogate)(params)
    fvp = lambda v: losses.fisher_vector_product(sub_kl, params, v, damping=0.01)
    d = losses.natural_gradient_step(grad, fvp, max_kl=1e-3, cg_iters=10)
    expected = sum(float(jnp.vdot(a, b)) for a, b in zip(jax.tree.leaves(grad),
                                                         jax.tree.leaves(d)))
    assert m["expected_gain"] == pytest.approx(expected, rel=2e-3)
    full = trpo.make_trpo_step(policy, prompt_len=3, max_kl=1e-3, damping=0.01, cg_iters=10)
    assert abs(float(full(params, batch)[1]["expected_gain"]) - expected) > 1e-3 * expected
    assert m["accepted"] == 1.0
    assert 0 < _exact_mean_kl(policy, params, step(params, batch)[0], batch, 3) <= 1e-3 * 1.0001


def test_trpo_section_errors_name_the_field():
    config = default_config.get_config("smoke")
    config.stages = "trpo"
    config.trpo = default_section("trpo")
    config.trpo.group_size = 1
    with pytest.raises(ConfigError, match=r"trpo\.group_size"):
        validate(config, KINDS)
    config.trpo = default_section("trpo")
    config.trpo.fisher_fraction = 0.0
    with pytest.raises(ConfigError, match=r"trpo\.fisher_fraction"):
        validate(config, KINDS)
    config.trpo = default_section("trpo")
    config.trpo.max_kl = 0.0
    with pytest.raises(ConfigError, match=r"trpo\.max_kl"):
        validate(config, KINDS)


def test_trpo_restart_gives_identical_parameters(crash_and_resume, monkeypatch):
    """4 TRPO steps straight vs 2 + crash + resume + 2: the same parameters and metrics (the
    policy, data iterator and PRNG key are restored; TRPO has no optimizer state)."""
    from grpo_jax.runner.rewards import REWARD_SOURCES

    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.trpo = default_section("trpo")
    config.trpo.update(dict(steps=4, num_prompts=4, group_size=4, max_new_tokens=12,
                            cg_iters=4, max_kl=0.01, checkpoint_every=2))
    # The untrained smoke model earns no task reward; a reward that differs between samples
    # (the share of digits in the completion) gives the groups non-zero advantages.
    digits = lambda completion, example: sum(c.isdigit() for c in completion) / max(
        len(completion), 1)
    monkeypatch.setitem(REWARD_SOURCES, "digit_share", lambda run, section: digits)
    config.trpo.rewards = {"accuracy": 1.0, "digit_share": 1.0}
    config.stages = "trpo"
    lines_a, lines_b = crash_and_resume(config, "trpo")
    assert any(r["kl_step"] > 0 for r in lines_a)  # the steps moved the policy
    for ra, rb in zip(lines_a, lines_b):
        for key in ("reward_mean", "kl_step", "surrogate_gain", "step_fraction"):
            assert ra[key] == rb[key], key
