"""Packed RL updates (`rl.packing`): an RL batch's rows packed into fixed token blocks give
the padded update's log-probs, losses and gradients, for GRPO (with KL and entropy terms),
PPO's policy and critic, and episode rows with holes and observation tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.models import ModelConfig, Transformer
from grpo_jax.rl import ppo
from grpo_jax.rl.algorithms import ALGORITHMS
from grpo_jax.rl.batch import RolloutBatch
from grpo_jax.rl.packing import blocks_needed, pack_rows, packed_completion_logprobs
from grpo_jax.rl.update import LossSettings, policy_loss, sequence_logp
from grpo_jax.training import Policy

CONFIG = ModelConfig(vocab_size=23, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, mlp_size=48, max_seq_len=48, value_head=True)
PAD, P, N = 0, 6, 14


def rollout_rows(prompt_lens, completion_lens, *, holes=(), seed=0):
    """A rollout's layout [B, P + N]: prompts left-padded, completions right-padded; `holes`
    (row, column) leave a completion slot empty (an episode's wait) and mark the slot after
    it as an observation (no loss)."""
    rng = np.random.default_rng(seed)
    rows = len(prompt_lens)
    tokens = np.full((rows, P + N), PAD, np.int32)
    mask = np.zeros((rows, P + N), bool)
    loss = np.zeros((rows, N), bool)
    for b, (p, n) in enumerate(zip(prompt_lens, completion_lens)):
        tokens[b, P - p:P + n] = rng.integers(1, CONFIG.vocab_size, p + n)
        mask[b, P - p:P + n] = True
        loss[b, :n] = True
    for b, column in holes:
        tokens[b, P + column] = PAD
        mask[b, P + column] = False
        loss[b, column] = loss[b, column + 1] = False
    return tokens, mask, loss


def batch_of(tokens, mask, loss, *, seed=1):
    rng = np.random.default_rng(seed)
    rows = tokens.shape[0]
    noise = lambda: jnp.asarray(rng.normal(size=(rows, N)).astype(np.float32) * 0.1)
    return RolloutBatch(
        tokens=jnp.asarray(tokens), attention_mask=jnp.asarray(mask),
        loss_mask=jnp.asarray(loss), behaviour_logp=noise() - 3.0,
        rewards=jnp.asarray(rng.normal(size=rows).astype(np.float32)),
        version=jnp.zeros(rows, jnp.int32),
        advantages=jnp.asarray(rng.normal(size=(rows, N)).astype(np.float32)),
        old_logp=noise() - 3.0, ref_logp=noise() - 3.0,
        old_values=noise(), returns=noise() + 0.5)


@pytest.fixture(scope="module")
def model():
    """A policy with a value head (random, not the critic's zeros): both halves tested."""
    policy, params = Policy.from_model(Transformer(CONFIG, rngs=nnx.Rngs(0)))
    params["value_kernel"] = jax.random.normal(jax.random.key(1), (CONFIG.hidden_size,))
    return policy, params


# Long-tailed lengths: most rows short, a few long (what packing is for); row 5 is an episode
# with a hole at completion column 4 (a wait) and an observation after it.
PROMPTS = [6, 3, 4, 6, 2, 5, 3, 4]
COMPLETIONS = [14, 3, 2, 5, 1, 12, 2, 4]
HOLES = [(5, 4)]


def test_pack_rows_by_hand():
    tokens, mask, _ = rollout_rows([2, 1, 3], [3, 1, 0])
    packed = pack_rows(tokens, mask, P, num_blocks=2, block_len=6)
    # lengths 5, 2, 3: first fit decreasing puts 5 in block 0, 3 in block 1, 2 there too
    np.testing.assert_array_equal(packed.segment_ids, [[1, 1, 1, 1, 1, 0],
                                                       [1, 1, 1, 2, 2, 0]])
    np.testing.assert_array_equal(packed.positions, [[0, 1, 2, 3, 4, 0], [0, 1, 2, 0, 1, 0]])
    np.testing.assert_array_equal(packed.tokens[0, :5], tokens[0, P - 2:P + 3])
    np.testing.assert_array_equal(packed.tokens[1, :5], np.r_[tokens[2, P - 3:P],
                                                              tokens[1, P - 1:P + 1]])
    expected = np.full((3, N), -1)
    expected[0, :3] = [2, 3, 4]  # row 0's completion after its 2 prompt tokens, block 0
    expected[1, 0] = 6 + 4  # row 1's one completion token: block 1, offset 4
    np.testing.assert_array_equal(packed.index, expected)
    assert blocks_needed(mask, 6) == 2
    assert pack_rows(tokens, mask, P, num_blocks=1, block_len=6) is None  # does not fit
    with pytest.raises(ValueError, match="a row of 5 tokens does not fit a block of 4"):
        pack_rows(tokens, mask, P, num_blocks=3, block_len=4)


def test_packed_logprobs_values_and_entropy_equal_the_padded_ones(model):
    policy, params = model
    tokens, mask, loss = rollout_rows(PROMPTS, COMPLETIONS, holes=HOLES)
    packed = pack_rows(tokens, mask, P, num_blocks=4, block_len=P + N)
    assert packed is not None and int(packed.attention_mask.sum()) == int(mask.sum())
    padded_logp, padded_entropy = sequence_logp(policy, params, jnp.asarray(tokens),
                                                jnp.asarray(mask), P, 0.7, return_entropy=True)
    out = packed_completion_logprobs(policy.bind(params), jax.tree.map(jnp.asarray, packed),
                                     temperature=0.7, return_entropy=True, return_values=True)
    keep = jnp.asarray(loss)
    np.testing.assert_allclose(jnp.where(keep, out["logp"], 0), jnp.where(keep, padded_logp, 0),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.where(keep, out["entropy"], 0),
                               jnp.where(keep, padded_entropy, 0), rtol=1e-5, atol=1e-5)
    values = ppo.completion_values(policy, params, jnp.asarray(tokens), jnp.asarray(mask), P)
    np.testing.assert_allclose(jnp.where(keep, out["values"], 0), jnp.where(keep, values, 0),
                               rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(jnp.where(keep, out["logp"], 0)).sum()) > 1.0  # not all zeros


@pytest.mark.parametrize("algorithm,beta,entropy_coef,loss_agg", [
    ("grpo", 0.04, 0.01, "seq-mean-token-mean"),
    ("dr_grpo", 0.0, 0.0, "seq-mean-token-sum-norm"),
    ("dapo", 0.0, 0.0, "token-mean"),
])
def test_packed_update_gradient_equals_the_padded_one(model, algorithm, beta, entropy_coef,
                                                      loss_agg):
    policy, params = model
    tokens, mask, loss = rollout_rows(PROMPTS, COMPLETIONS, holes=HOLES)
    batch = batch_of(tokens, mask, loss)
    packed = jax.tree.map(jnp.asarray, pack_rows(tokens, mask, P, num_blocks=4,
                                                 block_len=P + N))
    base = ALGORITHMS[algorithm].objective
    settings = LossSettings(epsilon=0.2, epsilon_high=0.28, dual_clip=None, ratio_level="token",
                            beta=beta, kl_kind="k3", loss_agg=loss_agg, on_policy=False,
                            temperature=1.0, objective=base, entropy_coef=entropy_coef)
    counts = dict(num_tokens=jnp.maximum(jnp.sum(batch.loss_mask), 1.0),
                  num_sequences=jnp.asarray(batch.rows, jnp.float32))

    def loss_of(p, b):
        return policy_loss(p, b, policy=policy, settings=settings, prompt_len=P, **counts)

    grad_fn = jax.jit(jax.value_and_grad(loss_of, has_aux=True))
    (loss_padded, metrics_padded), grads_padded = grad_fn(params, batch)
    (loss_packed, metrics_packed), grads_packed = grad_fn(params, batch.replace(packed=packed))
    assert float(optax.global_norm(grads_padded)) > 1e-3  # a real gradient
    np.testing.assert_allclose(loss_packed, loss_padded, rtol=1e-5, atol=1e-7)
    for name in metrics_padded:
        np.testing.assert_allclose(metrics_packed[name], metrics_padded[name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grads_packed, grads_padded)


def test_ppo_update_with_its_critic_packed_equals_padded(model):
    policy, params = model  # the critic: the same network (a value head on its trunk)
    tokens, mask, loss = rollout_rows(PROMPTS, COMPLETIONS, holes=HOLES)
    batch = batch_of(tokens, mask, loss)
    packed = jax.tree.map(jnp.asarray, pack_rows(tokens, mask, P, num_blocks=4,
                                                 block_len=P + N))
    optimizer = optax.sgd(1.0)
    step = ppo.make_ppo_update(policy, policy, optimizer, optimizer, prompt_len=P, epsilon=0.2,
                               value_clip=0.2)
    state = lambda: (jax.tree.map(jnp.copy, params), optimizer.init(params),
                     jax.tree.map(jnp.copy, params), optimizer.init(params))
    *padded, metrics_padded = step(*state(), batch)
    *packed_out, metrics_packed = step(*state(), batch.replace(packed=packed))
    assert float(metrics_padded["grad_norm"]) > 1e-3
    assert float(metrics_padded["critic_grad_norm"]) > 1e-3
    for name in ("pg_loss", "value_loss", "grad_norm", "critic_grad_norm", "entropy"):
        np.testing.assert_allclose(metrics_packed[name], metrics_padded[name], rtol=1e-4,
                                   err_msg=name)
    # sgd(1.0): the new parameters are the old minus the gradients, of policy and critic
    for new_packed, new_padded in ((packed_out[0], padded[0]), (packed_out[2], padded[2])):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                     new_packed, new_padded)


@pytest.mark.slow
def test_rl_stage_with_packed_updates_follows_the_padded_run(tmp_path):
    """rl.pack_blocks: the host loop packs each batch (16 rows into 16 blocks always fit;
    into 2 they never do, and those steps run padded): the runs' losses, gradient norms and
    final parameters agree with the padded run's to float tolerance; so does a run whose
    rollouts are sampled in 5 slots (rl.slots, continuous batching)."""
    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.config_presets import main_job
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import train_and_evaluate

    def run(blocks, slots=0):
        config = main_job("smoke")
        config.stages = "rl"
        config.mesh.num_devices = 1
        config.model.num_layers = 1
        config.rl.update(steps=3, pack_blocks=blocks, beta=0.04, slots=slots)
        workdir = tmp_path / f"{blocks},{slots}"
        train_and_evaluate(config, str(workdir))
        with Checkpointer(workdir / "checkpoints") as checkpointer:
            params = checkpointer.restore()[0]["params"]
        return [r for r in read_metrics(workdir) if r["stage"] == "rl"], params

    padded, padded_params = run(0)
    for blocks, slots, packed_steps in ((16, 0, 1.0), (2, 0, 0.0), (0, 5, None)):
        rows, params = run(blocks, slots)
        assert [r.get("packed") for r in rows] == [packed_steps] * 3
        if slots:  # the same rollouts, token for token
            assert [r["completion_length"] for r in rows] == \
                [r["completion_length"] for r in padded]
        for name in ("loss", "grad_norm", "kl_ref", "reward_mean", "entropy"):
            np.testing.assert_allclose([r[name] for r in rows], [r[name] for r in padded],
                                       rtol=2e-4, atol=1e-6, err_msg=name)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                     params, padded_params)


@pytest.mark.parametrize("field,value,needle", [
    ("pack_blocks", -1, r"^rl\.pack_blocks: expected >= 0"),
    ("micro_batches", 2, r"^rl\.pack_blocks: packed updates run one minibatch of one "
                         r"micro-batch; set micro_batches = 1"),
    ("fused_steps", 10, r"^rl\.pack_blocks: packed updates run in the host loop"),
    ("slots", -1, r"^rl\.slots: expected >= 0"),
])
def test_packed_update_settings_are_checked(field, value, needle):
    from grpo_jax.config_presets import main_job
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    config = main_job("smoke")
    config.rl.pack_blocks = 8
    config.rl[field] = value
    with pytest.raises(ConfigError, match=needle):
        validate(config, KINDS)


def test_continuous_batching_is_taken_with_tools_and_a_negative_count_refused():
    from grpo_jax.config_presets import tool_job
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    config = tool_job("smoke")
    config.rl.slots = 4
    validate(config, KINDS)
    config.rl.slots = -1
    with pytest.raises(ConfigError, match=r"^rl\.slots: "):
        validate(config, KINDS)
