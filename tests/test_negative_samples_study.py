"""rl.advantage_sign (the negative_samples study's option): the policy gradient on the tokens
of one sign of advantage only, by hand; its validation; its hash neutrality; the study's
arms."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl.rollout import Rollout
from grpo_jax.rl.update import (ADVANTAGE_SIGNS, LossSettings, advantage_sign_tokens,
                                batch_logp, policy_loss)
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS
from grpo_jax.stages import rl as rl_stage

from configs import default as default_config
from tests.test_algorithms import tiny_policy

ADVANTAGES = (1.0, -1.0, 0.5, 0.0, 2.0, -0.25)  # one per row; row 3's is zero


def smoke(**rl):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.rl.update(rl)
    return config


def tiny_batch(rows=6, prompt_len=3, new=5, seed=4):
    """Rows of random tokens; row b's completion has `lengths[b]` >= 1 valid tokens."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, 12, (rows, prompt_len + new)), jnp.int32)
    lengths = rng.integers(1, new + 1, rows)
    mask = jnp.asarray(np.arange(new)[None] < lengths[:, None])
    batch = Rollout(prompt_tokens=tokens[:, :prompt_len],
                    prompt_mask=jnp.ones((rows, prompt_len), bool),
                    tokens=tokens[:, prompt_len:], attention_mask=mask, loss_mask=mask,
                    behaviour_logp=jnp.zeros((rows, new), jnp.float32),
                    rewards=jnp.zeros(rows, jnp.float32), version=0).to_batch()
    return batch.with_advantages(jnp.asarray(ADVANTAGES)), prompt_len, lengths


def test_sign_tokens_by_hand():
    advantages = jnp.asarray([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0],
                              [0.3, -0.2, 0.0]])  # the last row: per-token advantages
    mask = jnp.asarray([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], bool)
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "positive"),
                                  [[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "negative"),
                                  [[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(advantage_sign_tokens(advantages, mask, "both"), mask)
    with pytest.raises(ValueError, match="advantage_sign: expected one of"):
        advantage_sign_tokens(advantages, mask, "neg")


@pytest.mark.parametrize("sign, kept_rows", [("positive", (0, 2, 4)), ("negative", (1, 5)),
                                             ("both", (0, 1, 2, 3, 4, 5))])
def test_loss_and_gradient_by_hand(sign, kept_rows):
    """One on-policy pass (ratio 1) of GRPO's clipped surrogate, seq-mean-token-mean, no KL:
    the per-token loss is -A_b, so the loss is -(1/B) sum over the kept rows of A_b (each
    row's token mean of a constant), and its gradient is that of sum_bt w_bt log pi_bt with
    w_bt = -A_b / (B n_b) on the kept rows' valid tokens and 0 elsewhere."""
    policy, params = tiny_policy()
    batch, prompt_len, lengths = tiny_batch()
    rows = batch.rows
    settings = LossSettings(loss_agg="seq-mean-token-mean", advantage_sign=sign)
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=jnp.sum(batch.loss_mask).astype(jnp.float32),
                             num_sequences=jnp.float32(rows), settings=settings)
    (value, metrics), grads = jax.value_and_grad(lambda p: loss(p, batch), has_aux=True)(
        params)
    # The loss: -(1/6) x (1 + 0.5 + 2) = -0.58333 (positive), -(1/6) x (-1 - 0.25) = +0.20833
    # (negative), -(1/6) x 2.25 = -0.375 (both).
    want = -sum(ADVANTAGES[b] for b in kept_rows) / rows
    assert float(value) == pytest.approx(want, rel=1e-6)
    assert {"positive": -3.5 / 6, "negative": 1.25 / 6, "both": -2.25 / 6}[sign] == \
        pytest.approx(want)
    weights = np.zeros(batch.loss_mask.shape, np.float32)
    for b in kept_rows:
        weights[b, :lengths[b]] = -ADVANTAGES[b] / (rows * lengths[b])

    def weighted_logp(p):
        logp, _ = batch_logp(policy, p, batch, prompt_len, 1.0)
        return jnp.sum(jnp.asarray(weights) * logp)

    want_grads = jax.grad(weighted_logp)(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, want_grads)
    kept_tokens = sum(int(lengths[b]) for b in kept_rows if ADVANTAGES[b] != 0.0)
    if sign == "both":
        assert "sign_frac" not in metrics
    else:
        assert float(metrics["sign_frac"]) == pytest.approx(kept_tokens / lengths.sum())
    assert np.abs(jax.flatten_util.ravel_pytree(grads)[0]).max() > 0


@pytest.mark.parametrize("sign", ["positive", "negative"])
@pytest.mark.parametrize("objective", ["clip", "cispo"])
def test_one_sign_is_the_full_loss_with_the_other_zeroed(sign, objective):
    """Off-policy ratios (old log-probs not the current ones), a dual clip, token-mean and an
    entropy bonus: the one-sign loss and gradient are the full loss's with the other sign's
    advantages set to zero (the counts, entropy and every other term unchanged)."""
    policy, params = tiny_policy()
    batch, prompt_len, _ = tiny_batch()
    old = jnp.asarray(np.random.default_rng(1).normal(-2.5, 0.5, batch.loss_mask.shape),
                      jnp.float32)
    batch = batch.replace(old_logp=old)
    common = dict(loss_agg="token-mean", on_policy=False, entropy_coef=0.01,
                  objective=objective, epsilon=0.2 if objective == "clip" else 1.0,
                  epsilon_high=0.28, dual_clip=3.0 if objective == "clip" else None)
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=jnp.sum(batch.loss_mask).astype(jnp.float32),
                             num_sequences=jnp.float32(batch.rows))
    one = functools.partial(loss, settings=LossSettings(**common, advantage_sign=sign))
    full = functools.partial(loss, settings=LossSettings(**common))
    keep = batch.advantages > 0 if sign == "positive" else batch.advantages < 0
    zeroed = batch.replace(advantages=jnp.where(keep, batch.advantages, 0.0))
    value, grads = jax.value_and_grad(lambda p: one(p, batch)[0])(params)
    want, want_grads = jax.value_and_grad(lambda p: full(p, zeroed)[0])(params)
    np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, want_grads)
    # ... and not the full loss itself.
    assert abs(float(value) - float(full(params, batch)[0])) > 1e-3


def test_section_default_validation_and_loss_settings():
    config = smoke()
    assert config.rl.advantage_sign == "both" and ADVANTAGE_SIGNS[0] == "both"
    for sign in ADVANTAGE_SIGNS:
        validate(smoke(advantage_sign=sign), KINDS)
        assert rl_stage.loss_settings(smoke(advantage_sign=sign).rl,
                                      on_policy=True).advantage_sign == sign
    # Every algorithm of the stage takes it (the loss is the stage's one policy_loss).
    validate(smoke(advantage_sign="negative", algorithm="reinforce_pp"), KINDS)
    # A config written before the field existed reads as "both".
    old = smoke()
    del old.rl.advantage_sign
    assert rl_stage.loss_settings(old.rl, on_policy=True).advantage_sign == "both"


@pytest.mark.parametrize("value", ["neg", "", "Negative"])
def test_a_bad_value_is_one_line_naming_the_field(value):
    with pytest.raises(ConfigError) as info:
        validate(smoke(advantage_sign=value), KINDS)
    lines = [line for line in str(info.value).splitlines() if "advantage_sign" in line]
    assert len(lines) == 1
    assert "rl.advantage_sign: expected one of ['both', 'positive', 'negative']" in lines[0]


def test_expert_iteration_refuses_the_negative_sign_it_would_train_nothing_on():
    """expert_iteration's advantages are 0 or 1: the negative sign keeps no token."""
    with pytest.raises(ConfigError, match=r"rl.advantage_sign: expert_iteration's advantages "
                                          r"are 0 or 1, never negative"):
        validate(smoke(advantage_sign="negative", algorithm="expert_iteration"), KINDS)
    validate(smoke(advantage_sign="positive", algorithm="expert_iteration"), KINDS)


def test_the_device_source_takes_it():
    """The fused program runs the learner's own iteration (its policy_loss), so validation
    lets a fused stage take either sign."""
    config = smoke(advantage_sign="positive", fused_steps=2, steps=2, checkpoint_every=2,
                   overlong_cache=0)
    validate(config, KINDS)


def test_both_keeps_every_run_hash_and_a_sign_changes_it():
    from grpo_jax.studies import configs

    config = smoke()
    without = smoke()
    del without.rl.advantage_sign
    assert configs.config_hash(config) == configs.config_hash(without)
    config.rl.advantage_sign = "negative"
    assert configs.config_hash(config) != configs.config_hash(without)


def test_the_arms_differ_in_the_sign_only_and_share_pass_at_k_run():
    from grpo_jax.studies import configs, negative_samples, pass_at_k

    for tier in ("mini", "full"):
        arms = negative_samples.arm_configs(tier)
        assert set(arms) == set(negative_samples.ARMS)
        assert configs.config_hash(arms[negative_samples.BOTH]) == \
            configs.config_hash(pass_at_k.arm_config(tier))
        for arm, sign in negative_samples.SIGNS.items():
            assert arms[arm].rl.advantage_sign == sign
            other = arms[arm].copy_and_resolve_references()
            other.rl.advantage_sign = "both"
            assert configs.config_hash(other) == configs.config_hash(arms[negative_samples.BOTH])


def test_training_figures_by_hand():
    """The last steps' entropy mean (window 2 of 5 rows: (0.3 + 0.1) / 2), the first step's,
    and the mean share of tokens carrying the gradient over the rows that log it."""
    from grpo_jax.studies.negative_samples import training_figures

    rows = [{"entropy": 0.9, "sign_frac": 0.5}, {"entropy": 0.7, "sign_frac": 0.3},
            {"entropy": 0.5}, {"entropy": 0.3, "sign_frac": 0.1}, {"entropy": 0.1}]
    out = training_figures(rows, window=2)
    assert out["entropy"] == pytest.approx(0.2)
    assert out["first_entropy"] == 0.9
    assert out["sign_frac"] == pytest.approx(0.3)
    # 3 rows: the window is half of them, rounded down (1): the last row alone.
    assert training_figures(rows[:3], window=10)["entropy"] == pytest.approx(0.5)
    assert training_figures([{"entropy": 0.4}])["sign_frac"] is None


@pytest.mark.slow
def test_the_fused_program_honours_the_sign(tmp_path):
    """The device source (fused_steps 2) and the host loop give the same negative-only
    updates: the same loss, gradient norm and share of tokens kept, step by step."""
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    from test_device_rewards import fused_config  # its config and its digit_share reward

    rows = {}
    for k in (0, 2):
        config = fused_config(k, steps=2, advantage_sign="negative")
        train_and_evaluate(config, str(tmp_path / f"k{k}"))
        rows[k] = read_metrics(str(tmp_path / f"k{k}" / "metrics.jsonl"))
    host, fused = rows[0], rows[2]
    assert [r["stage_step"] for r in fused] == [1, 2]
    for a, b in zip(host, fused):
        assert 0 < a["sign_frac"] < 1
        for key in ("reward_mean", "sign_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key
        for key in ("loss", "grad_norm", "entropy", "kl_ref"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
