"""The algorithm table: records, resolved defaults, REINFORCE++, CISPO and the entropy bonus."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import losses
from grpo_jax.rl import algorithms
from grpo_jax.rl.algorithms import ALGORITHMS, EstimatorInputs, compute_advantages
from grpo_jax.rl.batch import rollout_record
from grpo_jax.rl.rollout import Rollout
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS, default_section
from grpo_jax.stages import rl as rl_stage

from configs import default as default_config


def smoke(**rl):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.rl.update(rl)
    return config


# ----------------------------------------------------------------------------- the table

def test_every_record_validates_and_lists_derive_from_the_table():
    for name, algorithm in ALGORITHMS.items():
        validate(smoke(algorithm=name), KINDS)
        assert algorithm.description and algorithm.loss_agg in losses.AGGREGATION_MODES
    assert KINDS["rl"].description == "GRPO family: " + ", ".join(ALGORITHMS)
    with pytest.raises(ConfigError, match=r"rl\.algorithm: expected one of .*'cispo'.*"
                                          r"'reinforce_pp'"):
        validate(smoke(algorithm="ppo2"), KINDS)
    # A group-relative estimator refuses G = 1; REINFORCE++ (global normalisation) takes it.
    with pytest.raises(ConfigError, match="rl.group_size: cispo needs G >= 2"):
        validate(smoke(algorithm="cispo", group_size=1), KINDS)
    validate(smoke(algorithm="reinforce_pp", group_size=1), KINDS)


def test_records_refuse_unknown_pieces():
    with pytest.raises(ValueError, match="objective 'trust' not in"):
        algorithms.Algorithm("x", lambda i: i.rewards, "token-mean", "", objective="trust")
    with pytest.raises(ValueError, match=r"defaults for unknown fields \['clip'\]"):
        algorithms.Algorithm("x", lambda i: i.rewards, "token-mean", "", defaults={"clip": 1})
    with pytest.raises(ValueError, match="loss_agg 'mean' not in"):
        algorithms.Algorithm("x", lambda i: i.rewards, "mean", "")


def test_the_objective_is_a_record_like_the_estimator():
    """Each record holds its objective as an `Objective` member (a name is made the member,
    and a member equals its name); the loss calls it, and CISPO alone takes only the
    per-token ratio."""
    assert ALGORITHMS["cispo"].objective is algorithms.Objective.CISPO
    assert ALGORITHMS["grpo"].objective is algorithms.Objective.CLIP == "clip"
    named = algorithms.Algorithm("x", lambda i: i.rewards, "token-mean", "", objective="cispo")
    assert named.objective is algorithms.Objective.CISPO and named.objective.token_ratio_only
    assert not algorithms.Objective.CLIP.token_ratio_only
    logp, old_logp = jnp.log(jnp.array([[0.5, 0.2]])), jnp.log(jnp.array([[0.4, 0.3]]))
    adv, mask = jnp.array([[1.0, -1.0]]), jnp.ones((1, 2), bool)
    kwargs = dict(epsilon=0.2, epsilon_high=0.28, dual_clip=None, ratio_level="token", mask=mask)
    for objective, kernel in ((algorithms.Objective.CLIP, losses.clipped_surrogate),
                              (algorithms.Objective.CISPO, losses.cispo_surrogate)):
        expected = kernel(logp, old_logp, adv, epsilon=0.2, epsilon_high=0.28, mask=mask)
        for got, want in zip(objective.loss(logp, old_logp, adv, **kwargs), expected):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_auto_fields_take_the_algorithm_defaults_and_explicit_values_win():
    def resolved(**rl):
        return rl_stage.settings(smoke(**rl).rl)[1]

    grpo = resolved(algorithm="grpo")
    assert (grpo.epsilon, grpo.epsilon_high, grpo.beta, grpo.kl_kind, grpo.loss_agg) == (
        0.2, 0.2, 0.01, "k3", "seq-mean-token-mean")
    assert not grpo.dynamic_sampling and not grpo.overlong_filter
    dapo = resolved(algorithm="dapo")
    assert (dapo.epsilon, dapo.epsilon_high, dapo.beta, dapo.loss_agg) == (
        0.2, 0.28, 0.0, "token-mean")
    assert dapo.dynamic_sampling and dapo.overlong_filter
    gspo = resolved(algorithm="gspo")
    assert (gspo.ratio_level, gspo.epsilon, gspo.epsilon_high) == ("sequence", 3e-4, 4e-4)
    cispo = resolved(algorithm="cispo")
    assert (cispo.epsilon, cispo.epsilon_high, cispo.beta) == (1.0, 0.28, 0.0)
    assert resolved(algorithm="reinforce_pp").kl_kind == "k1"
    # Explicit values win; an unset epsilon_high follows the given epsilon (symmetric clip)
    # unless the record sets its own.
    mine = resolved(algorithm="dapo", beta=0.02, dynamic_sampling="off",
                    loss_agg="seq-mean-token-sum")
    assert (mine.beta, mine.dynamic_sampling, mine.loss_agg) == (0.02, False,
                                                                 "seq-mean-token-sum")
    assert resolved(algorithm="grpo", epsilon=0.1).epsilon_high == 0.1
    assert resolved(algorithm="dapo", epsilon=0.1).epsilon_high == 0.28
    # The loss settings follow the record: CISPO's objective, REINFORCE++'s KL off the loss.
    cispo_loss = rl_stage.loss_settings(smoke(algorithm="cispo").rl, on_policy=True)
    assert cispo_loss.objective == "cispo" and cispo_loss.beta == 0.0
    pp_loss = rl_stage.loss_settings(smoke(algorithm="reinforce_pp").rl, on_policy=True)
    assert pp_loss.objective == "clip" and pp_loss.beta == 0.0


@pytest.mark.parametrize("rl, needle", [
    ({"algorithm": "cispo", "ratio_level": "sequence"}, "rl.ratio_level: cispo weights"),
    ({"algorithm": "cispo", "dual_clip": 3.0}, "rl.dual_clip: cispo weights"),
    ({"beta": -0.5}, r"rl.beta: expected a value in \[0.0, inf\)"),
    ({"epsilon": 0.0}, "rl.epsilon"),
    ({"entropy_coef": -0.1}, "rl.entropy_coef"),
    ({"kl_kind": "k4"}, "rl.kl_kind"),
])
def test_bad_algorithm_fields_name_the_field(rl, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(smoke(**rl), KINDS)


def test_per_sequence_estimators_broadcast_and_per_token_ones_pass_through():
    rewards = jnp.asarray([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], jnp.float32)
    mask = jnp.asarray(np.arange(4)[None] < np.array([[4], [2], [3], [1], [4], [2]]))
    inputs = EstimatorInputs(rewards=rewards, correct=rewards > 0, mask=mask, group_size=3)
    grpo = compute_advantages("grpo", inputs)
    assert grpo.shape == (6, 4)
    want = losses.group_advantages(rewards, group_size=3)
    np.testing.assert_allclose(grpo, np.broadcast_to(want[:, None], (6, 4)))
    np.testing.assert_allclose(compute_advantages("expert_iteration", inputs)[:, 0],
                               [1, 0, 0, 0, 1, 1])
    pp = compute_advantages("reinforce_pp", inputs)
    np.testing.assert_array_equal(pp[~np.asarray(mask)], 0.0)
    bad = dataclasses.replace(ALGORITHMS["grpo"], estimator=lambda i: jnp.zeros((6, 5)))
    with pytest.raises(ValueError, match=r"estimator returned advantages of shape \(6, 5\)"):
        compute_advantages(bad, inputs)


# ----------------------------------------------------------------------------- REINFORCE++

def verl_style_reinforce_pp(token_rewards, mask):
    """An independent reading of verl's REINFORCE++ outcome estimator
    (core_algos.compute_reinforce_plus_plus_outcome_advantage, gamma = 1): a Python loop
    for the return-to-go, reset past the end of each response, then a masked whitening
    with the unbiased variance and eps 1e-8, in float64."""
    token_rewards, mask = np.asarray(token_rewards, np.float64), np.asarray(mask, np.float64)
    returns = np.zeros_like(token_rewards)
    running = np.zeros(token_rewards.shape[0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + running
        returns[:, t] = running
        running = running * mask[:, t]
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = (((returns - mean) ** 2) * mask).sum() / n * n / (n - 1)
    return (returns - mean) / np.sqrt(var + 1e-8) * mask


def test_reinforce_pp_by_hand():
    # Two rows: score 1 over 2 tokens with penalties 0.1, 0.2; score 0 over 1 token with 0.3.
    scores = np.array([1.0, 0.0])
    mask = np.array([[True, True], [True, False]])
    penalty = np.array([[0.1, 0.2], [0.3, 9.0]])  # 9.0 sits on padding: ignored
    # returns: row 0: [1 - 0.3, 1 - 0.2] = [0.7, 0.8]; row 1: [-0.3]
    returns = np.array([0.7, 0.8, -0.3])
    whitened = (returns - returns.mean()) / np.sqrt(returns.var(ddof=1) + 1e-8)
    got = np.asarray(losses.reinforce_pp_advantages(scores, mask, token_penalty=penalty))
    np.testing.assert_allclose(got[mask], whitened, rtol=1e-5)
    assert got[1, 1] == 0.0


def test_reinforce_pp_agrees_with_the_peer():
    rng = np.random.default_rng(0)
    rows, length = 16, 9
    lengths = rng.integers(1, length + 1, rows)
    mask = np.arange(length)[None] < lengths[:, None]
    scores = rng.integers(0, 2, rows).astype(np.float64)
    logp, ref_logp = -rng.uniform(0.1, 3, (2, rows, length))
    beta = 0.05
    kl = np.asarray(losses.kl_penalty(logp, ref_logp, kind="k1"))
    # The peer's token-level rewards: -beta * KL on every valid token, the score on the last.
    token_rewards = np.where(mask, -beta * kl, 0.0)
    token_rewards[np.arange(rows), lengths - 1] += scores
    want = verl_style_reinforce_pp(token_rewards, mask)
    got = losses.reinforce_pp_advantages(scores, mask, token_penalty=beta * kl)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # Through the table: the estimator reads the penalty the learner passes.
    inputs = EstimatorInputs(rewards=jnp.asarray(scores, jnp.float32), correct=scores > 0,
                             mask=jnp.asarray(mask), group_size=1,
                             token_penalty=jnp.asarray(beta * kl, jnp.float32))
    np.testing.assert_allclose(compute_advantages("reinforce_pp", inputs), want, rtol=2e-5,
                               atol=2e-6)


# ----------------------------------------------------------------------------- CISPO

def test_cispo_by_hand_and_every_token_keeps_a_gradient():
    old_logp = jnp.log(jnp.asarray([[0.5, 0.5, 0.5, 0.5]]))
    # ratios 1.6, 0.2, 1.0, 1.6 against advantages +1, -1, +2, -1
    logp = jnp.log(jnp.asarray([[0.8, 0.1, 0.5, 0.8]]))
    adv = jnp.asarray([[1.0, -1.0, 2.0, -1.0]])
    loss, clipped = losses.cispo_surrogate(logp, old_logp, adv, epsilon=0.5, epsilon_high=0.28)
    weight = np.array([1.28, 0.5, 1.0, 1.28])
    np.testing.assert_allclose(loss[0], -weight * np.asarray(adv[0]) * np.asarray(logp[0]),
                               rtol=1e-6)
    np.testing.assert_array_equal(clipped[0], [True, True, False, True])
    # d loss / d logp = -w A everywhere, clipped tokens included ...
    grad = jax.grad(lambda lp: losses.cispo_surrogate(lp, old_logp, adv, epsilon=0.5,
                                                      epsilon_high=0.28)[0].sum())(logp)
    np.testing.assert_allclose(grad[0], -weight * np.asarray(adv[0]), rtol=1e-6)
    # ... where PPO's clipped surrogate gives exactly 0 on the tokens it clips.
    ppo_grad = jax.grad(lambda lp: losses.clipped_surrogate(lp, old_logp, adv, epsilon=0.5,
                                                            epsilon_high=0.28)[0].sum())(logp)
    np.testing.assert_array_equal(ppo_grad[0, 0], 0.0)
    assert np.all(np.asarray(grad[0, [0, 1]]) != 0.0)
    # At ratio 1 (a single on-policy pass) both objectives have the same gradient.
    same = jax.grad(lambda lp: losses.cispo_surrogate(lp, jax.lax.stop_gradient(lp), adv,
                                                      epsilon=1.0, epsilon_high=0.28)[0].sum())
    ppo_same = jax.grad(lambda lp: losses.clipped_surrogate(lp, jax.lax.stop_gradient(lp), adv,
                                                            epsilon=0.2)[0].sum())
    np.testing.assert_allclose(same(logp), ppo_same(logp), rtol=1e-6)


# ----------------------------------------------------------------------------- the update

def tiny_policy():
    from grpo_jax.models import Transformer, named_config
    from grpo_jax.training import Policy

    model = Transformer(named_config("tiny-1m", vocab_size=12, hidden_size=32, num_layers=1,
                                     num_heads=2, num_kv_heads=1, head_dim=16, mlp_size=64,
                                     max_seq_len=16), rngs=nnx.Rngs(0))
    return Policy.from_model(model)


def tiny_batch(rows=4, prompt_len=3, new=5, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, 12, (rows, prompt_len + new)), jnp.int32)
    mask = jnp.asarray(np.arange(new)[None] < rng.integers(1, new + 1, rows)[:, None])
    batch = Rollout(prompt_tokens=tokens[:, :prompt_len],
                    prompt_mask=jnp.ones((rows, prompt_len), bool),
                    tokens=tokens[:, prompt_len:], attention_mask=mask, loss_mask=mask,
                    behaviour_logp=jnp.zeros((rows, new), jnp.float32),
                    rewards=jnp.asarray(rng.integers(0, 2, rows), jnp.float32),
                    version=3).to_batch()
    return batch, prompt_len


def test_entropy_bonus_is_subtracted_and_raises_the_entropy():
    import functools

    from grpo_jax.rl.update import LossSettings, policy_loss

    policy, params = tiny_policy()
    batch, prompt_len = tiny_batch()
    num_tokens = jnp.sum(batch.loss_mask).astype(jnp.float32)
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=num_tokens, num_sequences=jnp.float32(batch.rows))
    with_adv = batch.with_advantages(jnp.asarray([1.0, -1.0, 0.5, 0.0]))
    plain, m = loss(params, with_adv, settings=LossSettings(loss_agg="token-mean"))
    bonus, _ = loss(params, with_adv, settings=LossSettings(loss_agg="token-mean",
                                                            entropy_coef=0.01))
    np.testing.assert_allclose(bonus, plain - 0.01 * m["entropy"], rtol=1e-6)
    # With zero advantages the loss is the bonus alone: a gradient step raises the entropy.
    zero = batch.with_advantages(jnp.zeros(batch.rows))
    settings = LossSettings(loss_agg="token-mean", entropy_coef=1.0)
    grads = jax.grad(lambda p: loss(p, zero, settings=settings)[0])(params)
    stepped = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    before = loss(params, zero, settings=settings)[1]["entropy"]
    after = loss(stepped, zero, settings=settings)[1]["entropy"]
    assert after > before


def test_entropy_token_selection_by_hand():
    """The top 0.2 / bottom 0.8 of six masked tokens by entropy (quantiles interpolated
    linearly over the masked ones; a masked-out token is never chosen)."""
    from grpo_jax.rl.update import entropy_tokens

    entropy = jnp.asarray([[0.1, 0.9, 0.5, 0.3], [0.7, 0.2, 5.0, 4.0]])
    mask = jnp.asarray([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    # sorted masked values 0.1 0.2 0.3 0.5 0.7 0.9: the 0.8 quantile is the 5th, 0.7
    np.testing.assert_array_equal(entropy_tokens(entropy, mask, 0.2, "top"),
                                  [[0, 1, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(entropy_tokens(entropy, mask, 0.8, "bottom"),
                                  [[1, 0, 1, 1], [1, 1, 0, 0]])
    # the 0.5 quantile interpolates between 0.3 and 0.5: 0.4
    np.testing.assert_array_equal(entropy_tokens(entropy, mask, 0.5, "top"),
                                  [[0, 1, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(entropy_tokens(entropy, mask, 1.0, "top"), mask)


@pytest.mark.parametrize("side", ["top", "bottom"])
def test_selected_tokens_carry_the_policy_gradient_alone(side):
    """With entropy_tokens < 1 the loss and its gradient are those of the full loss with the
    advantages of the tokens not selected set to zero (the counts unchanged)."""
    import functools

    from grpo_jax.rl.update import LossSettings, entropy_tokens, policy_loss

    policy, params = tiny_policy()
    batch, prompt_len = tiny_batch(rows=6, new=6, seed=2)
    batch = batch.with_advantages(jnp.asarray([1.0, -1.0, 0.5, -0.3, 2.0, -2.0]))
    num_tokens = jnp.sum(batch.loss_mask).astype(jnp.float32)
    loss = functools.partial(policy_loss, policy=policy, prompt_len=prompt_len,
                             num_tokens=num_tokens, num_sequences=jnp.float32(batch.rows),
                             settings=LossSettings(loss_agg="token-mean"))
    selective = functools.partial(loss, settings=LossSettings(
        loss_agg="token-mean", token_fraction=0.3, token_side=side))
    _, metrics = loss(params, batch)
    from grpo_jax.rl.update import batch_logp

    _, entropy = batch_logp(policy, params, batch, prompt_len, 1.0)
    chosen = entropy_tokens(entropy, batch.loss_mask, 0.3, side)
    assert 0 < int(chosen.sum()) < int(batch.loss_mask.sum())
    masked = batch.replace(advantages=jnp.where(chosen, batch.advantages, 0.0))
    value, grads = jax.value_and_grad(lambda p: selective(p, batch)[0])(params)
    want, want_grads = jax.value_and_grad(lambda p: loss(p, masked)[0])(params)
    np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, want_grads)
    assert float(selective(params, batch)[1]["token_frac"]) == pytest.approx(
        float(chosen.sum() / batch.loss_mask.sum()))
    assert np.abs(jax.flatten_util.ravel_pytree(grads)[0]).max() > 0


def test_rollout_batch_is_one_typed_structure():
    batch, prompt_len = tiny_batch()
    assert batch.prompt_len == prompt_len and batch.rows == 4
    np.testing.assert_array_equal(batch.version, [3, 3, 3, 3])
    assert batch.advantages is None and batch.ref_logp is None
    per_seq = batch.with_advantages(jnp.asarray([1.0, 2.0, 3.0, 4.0]))
    assert per_seq.advantages.shape == batch.loss_mask.shape
    with pytest.raises(ValueError, match=r"advantages: expected \[B\]=\(4,\)"):
        batch.with_advantages(jnp.zeros(3))
    with pytest.raises(ValueError, match=r"Rollout.to_batch: rewards has shape \(3,\)"):
        Rollout(prompt_tokens=np.zeros((4, 2)), prompt_mask=np.ones((4, 2)),
                tokens=np.zeros((4, 5)), attention_mask=np.ones((4, 5)),
                loss_mask=np.ones((4, 5)), behaviour_logp=np.zeros((4, 5)),
                rewards=np.zeros(3), version=0).to_batch()
    # Host arrays stay numpy (placed on the mesh by the loop), and the loss mask never
    # extends past the generated tokens.
    host = Rollout(prompt_tokens=np.zeros((2, 2), np.int32), prompt_mask=np.ones((2, 2), bool),
                   tokens=np.zeros((2, 3), np.int32),
                   attention_mask=np.array([[1, 1, 0], [1, 0, 0]], bool),
                   loss_mask=np.ones((2, 3), bool), behaviour_logp=np.zeros((2, 3)),
                   rewards=np.zeros(2), version=1).to_batch()
    assert isinstance(host.tokens, np.ndarray)
    np.testing.assert_array_equal(host.loss_mask, [[1, 1, 0], [1, 0, 0]])
    # Split and sliced by tree maps alone (micro-batches, row groups, minibatches).
    halves = jax.tree.map(lambda x: x[:2], per_seq)
    assert halves.rows == 2 and halves.advantages.shape == (2, 5)


def test_rollout_record_by_hand():
    record = jax.device_get(rollout_record(
        np.array([1.0, 0.0, 1.0, 1.0]), {"accuracy": np.array([1, 0, 1, 1])},
        np.array([True, False, True, True]), np.array([3, 5, 4, 4]),
        np.array([False, True, False, False]), group_size=2))
    assert record["reward_mean"] == pytest.approx(0.75)
    assert record["reward_std"] == pytest.approx(np.std([1, 0, 1, 1]))
    assert record["pass@1"] == pytest.approx(0.75) and record["reward/accuracy"] == 0.75
    assert record["completion_length"] == 4.0 and record["truncated_frac"] == 0.25
    assert record["zero_std_groups"] == 0.5  # the second group (1, 1) carries no signal
    assert record["length_correct"] == pytest.approx(11 / 3)  # lengths 3, 4, 4
    assert record["length_incorrect"] == 5.0
    none_wrong = jax.device_get(rollout_record(
        np.ones(2), {}, np.array([True, True]), np.array([2, 6]), np.zeros(2, bool),
        group_size=2))
    assert none_wrong["length_correct"] == 4.0 and np.isnan(none_wrong["length_incorrect"])


def test_section_default_comment_matches_the_table():
    section = default_section("rl")
    assert section.algorithm in ALGORITHMS
    assert section.beta is None and section.epsilon is None and section.loss_agg == "auto"
