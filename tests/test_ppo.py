"""PPO with a critic: per-token rewards, adaptive KL, value alignment, GAE batch, one step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.models import Transformer, logprobs, named_config
from grpo_jax.rl import ppo
from grpo_jax.rl.rollout import Rollout
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS, default_section
from grpo_jax.rl.reward_model import add_scalar_head, scalar_head_policy
from grpo_jax.rl.update import sequence_logp
from grpo_jax.training import Policy

from configs import default as default_config


def test_reward_lands_on_last_valid_token():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    logp = np.full((4, 4), -1.0, np.float32)
    ref_logp = np.full((4, 4), -1.5, np.float32)  # logp - ref = 0.5 everywhere
    scores = np.array([2.0, -1.0, 5.0, 3.0], np.float32)
    r = np.asarray(ppo.ppo_token_rewards(scores, logp, ref_logp, mask, beta=0.1))
    expected = np.array([[-0.05, -0.05, 1.95, 0.0],
                         [-1.05, 0.0, 0.0, 0.0],
                         [0.0, 0.0, 0.0, 0.0],  # no valid token: no reward anywhere
                         [-0.05, -0.05, -0.05, 2.95]], np.float32)
    np.testing.assert_allclose(r, expected, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ppo.last_valid_index(mask)), [2, 0, 0, 3])


def test_an_environments_turn_rewards_land_where_they_were_earned():
    """token_rewards (turn rewards inside the score) sit on their tokens, the rest of the
    score on the last valid token: the same return per row, credited per turn."""
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)
    logp = np.full((2, 5), -1.0, np.float32)
    ref_logp = np.full((2, 5), -1.5, np.float32)
    scores = np.array([1.5, 0.5], np.float32)  # each includes its turn rewards
    turns = np.array([[0.0, 0.5, 0.0, 1.0, 0.7],  # 0.7 on padding: ignored
                      [0.25, 0.0, 0.0, 0.0, 0.0]], np.float32)
    r = np.asarray(ppo.ppo_token_rewards(scores, logp, ref_logp, mask, beta=0.1,
                                         token_rewards=turns))
    expected = np.array([[-0.05, 0.45, -0.05, -0.05 + 1.0 + (1.5 - 1.5), 0.0],
                         [0.2, -0.05 + (0.5 - 0.25), 0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(r, expected, atol=1e-6)
    plain = np.asarray(ppo.ppo_token_rewards(scores, logp, ref_logp, mask, beta=0.1))
    np.testing.assert_allclose(r.sum(1), plain.sum(1), atol=1e-6)  # the same return


def test_reward_with_zero_beta_is_only_the_score():
    mask = np.array([[1, 1, 0, 0, 0]], bool)
    r = ppo.ppo_token_rewards(np.array([0.7]), np.zeros((1, 5)), -np.ones((1, 5)), mask, beta=0.0)
    np.testing.assert_allclose(np.asarray(r), [[0.0, 0.7, 0.0, 0.0, 0.0]], atol=1e-7)
    with pytest.raises(ValueError, match="scores"):
        ppo.ppo_token_rewards(np.zeros(2), np.zeros((1, 5)), np.zeros((1, 5)), mask, beta=0.1)


def test_adaptive_kl_controller_literals():
    # KL far above target: the error is clipped to +0.2; 0.1 * (1 + 0.2 * 100 / 1000) = 0.102.
    assert ppo.adaptive_kl_coef(0.1, 0.5, target=0.1, horizon=1000, num_samples=100) == \
        pytest.approx(0.102)
    # KL 10% under target: e = -0.1; 0.1 * (1 - 0.1 * 100 / 1000) = 0.099.
    assert ppo.adaptive_kl_coef(0.1, 0.09, target=0.1, horizon=1000, num_samples=100) == \
        pytest.approx(0.099)
    assert ppo.adaptive_kl_coef(0.1, 0.1, target=0.1, horizon=1000, num_samples=100) == \
        pytest.approx(0.1)


def _rollout(tokens, prompt_len, completion_mask, scores):
    """A RolloutBatch of the given sequences (sampler log-probs 0: unused here)."""
    rows = tokens.shape[0]
    return Rollout(prompt_tokens=tokens[:, :prompt_len],
                   prompt_mask=jnp.ones((rows, prompt_len), bool),
                   tokens=tokens[:, prompt_len:], attention_mask=completion_mask,
                   loss_mask=completion_mask,
                   behaviour_logp=jnp.zeros(completion_mask.shape, jnp.float32),
                   rewards=jnp.asarray(scores, jnp.float32), version=0).to_batch()


def _tiny():
    config = named_config("tiny-1m", vocab_size=12, hidden_size=32, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16, mlp_size=64, max_seq_len=16)
    policy, params = Policy.from_model(Transformer(config, rngs=nnx.Rngs(0)))
    return config, policy, params


def test_critic_starts_from_policy_and_values_read_before_each_token():
    config, policy, params = _tiny()
    critic = scalar_head_policy(config)
    critic_params = add_scalar_head(params)
    np.testing.assert_array_equal(critic_params["embedding"], params["embedding"])
    rng = np.random.default_rng(0)
    critic_params["value_kernel"] = jnp.asarray(rng.normal(size=32), jnp.float32)
    tokens = jnp.asarray(rng.integers(1, 12, (2, 7)), jnp.int32)
    attn = jnp.ones((2, 7), bool)
    full = logprobs(critic.bind(critic_params), tokens, attn, return_values=True)["values"]
    values = ppo.completion_values(critic, critic_params, tokens, attn, 3)
    # Completion token j sits at position 3 + j; its state is read after position 2 + j.
    np.testing.assert_allclose(values, full[:, 2:6], rtol=1e-6)


def test_prepare_gives_reward_to_go_with_zero_critic():
    config, policy, params = _tiny()
    critic = scalar_head_policy(config)
    critic_params = add_scalar_head(params)  # zero head: V = 0 everywhere
    rng = np.random.default_rng(1)
    prompt_len, new = 3, 5
    tokens = jnp.asarray(rng.integers(1, 12, (3, prompt_len + new)), jnp.int32)
    completion_mask = jnp.asarray(np.arange(new)[None] < np.array([[5], [2], [4]]))
    batch = _rollout(tokens, prompt_len, completion_mask, [1.0, -2.0, 0.5])
    ref_params = jax.tree.map(lambda x: x * 0.9, params)
    prepare = ppo.make_prepare_fn(policy, critic, prompt_len=prompt_len, gamma=1.0,
                                  lambda_=1.0, whiten_advantages=False)
    out, _ = jax.device_get(prepare(params, ref_params, critic_params, batch,
                                    jnp.float32(0.2)))
    m = np.asarray(completion_mask)
    r = np.asarray(ppo.ppo_token_rewards(batch.rewards, out.old_logp, out.ref_logp, m,
                                         beta=0.2))
    reward_to_go = np.where(m, np.cumsum(r[:, ::-1], axis=1)[:, ::-1], 0.0)
    np.testing.assert_allclose(out.advantages, reward_to_go, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.returns, reward_to_go, rtol=1e-5, atol=1e-6)
    # Sum of per-token rewards = score - beta * sum of log-ratios.
    log_ratio = np.where(m, out.old_logp - out.ref_logp, 0.0).sum(1)
    np.testing.assert_allclose(r.sum(1), [1.0, -2.0, 0.5] - 0.2 * log_ratio, rtol=1e-5)
    whitened = ppo.make_prepare_fn(policy, critic, prompt_len=prompt_len, gamma=1.0, lambda_=1.0)
    adv = np.asarray(whitened(params, ref_params, critic_params, batch, 0.2)[0].advantages)[m]
    assert abs(adv.mean()) < 1e-5 and abs(adv.std() - 1.0) < 1e-3


def test_ppo_section_errors_name_the_field():
    config = default_config.get_config("smoke")
    config.stages = "ppo"
    config.ppo = default_section("ppo")
    config.ppo.num_minibatches = 3
    with pytest.raises(ConfigError, match=r"ppo\.num_minibatches"):
        validate(config, KINDS)
    config.ppo = default_section("ppo")
    config.ppo.rewards = {"reward_model": 1.0}
    with pytest.raises(ConfigError, match=r"ppo\.reward_model"):
        validate(config, KINDS)


def test_ppo_update_fits_the_critic_and_moves_the_policy():
    from grpo_jax.training import make_optimizer

    config, policy, params = _tiny()
    critic = scalar_head_policy(config)
    critic_params = add_scalar_head(params)
    rng = np.random.default_rng(2)
    prompt_len, new, rows = 3, 5, 4
    tokens = jnp.asarray(rng.integers(1, 12, (rows, prompt_len + new)), jnp.int32)
    completion_mask = jnp.asarray(np.arange(new)[None] < np.array([[5], [3], [4], [1]]))
    batch = _rollout(tokens, prompt_len, completion_mask, [1.0, 0.0, 1.0, 0.0])
    prepare = ppo.make_prepare_fn(policy, critic, prompt_len=prompt_len, gamma=1.0, lambda_=0.95)
    batch, _ = prepare(params, params, critic_params, batch, jnp.float32(0.0))
    opt, _ = make_optimizer(lr=3e-3, steps=100, warmup_frac=0.0, clip_norm=0.0)
    update = ppo.make_ppo_update(policy, critic, opt, opt, prompt_len=prompt_len, epsilon=0.2,
                                 value_clip=None)
    p, c = jax.tree.map(jnp.copy, params), critic_params
    state = (p, opt.init(p), c, opt.init(c))
    first_logp = np.asarray(batch.old_logp)
    losses_seen = []
    for _ in range(8):
        *state, metrics = update(*state, batch)
        losses_seen.append(float(metrics["value_loss"]))
    assert losses_seen[-1] < 0.5 * losses_seen[0]  # the critic regresses onto the returns
    new_logp = np.asarray(sequence_logp(policy, state[0], batch.tokens,
                                        batch.attention_mask, prompt_len)[0])
    m = np.asarray(completion_mask)
    adv = np.asarray(batch.advantages)
    # The policy raised the log-prob of positive-advantage tokens on balance.
    assert np.sum(((new_logp - first_logp) * adv)[m]) > 0


def test_ppo_restart_gives_identical_parameters(crash_and_resume):
    """4 PPO steps straight vs 2 + crash + resume + 2: the same policy, critic-driven updates
    and adaptive KL coefficient (both optimizers, critic, reference and data state restored)."""
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.ppo = default_section("ppo")
    config.ppo.update(dict(steps=4, num_prompts=4, group_size=2, num_iterations=1,
                           num_minibatches=1, max_new_tokens=12, beta=0.1, adaptive_kl=True,
                           kl_target=0.05, kl_horizon=80, checkpoint_every=2))
    config.stages = "ppo"
    lines_a, lines_b = crash_and_resume(config, "ppo")
    # Step 1: the policy is the reference, so the measured KL is 0 and the controller lowers
    # beta by the clipped error: 0.1 * (1 - 0.2 * 8 / 80) = 0.098 (8 samples per step).
    assert lines_a[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert lines_a[0]["kl_coef"] == pytest.approx(0.1)
    assert lines_a[1]["kl_coef"] == pytest.approx(0.098)
    for key in ("loss", "pg_loss", "value_loss", "grad_norm", "critic_grad_norm", "entropy",
                "clip_frac", "kl_step", "value_mean"):
        assert np.isfinite(lines_a[0][key]), key
    for ra, rb in zip(lines_a, lines_b):
        for key in ("reward_mean", "loss", "value_loss", "kl_coef"):
            assert ra[key] == rb[key], key
