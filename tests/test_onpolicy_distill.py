"""On-policy distillation (stage kind "onpolicy_distill"): the reverse KL's gradient against
its definition, the loss against numpy with a teacher of another size, and a run whose
student samples and learns from another run's final policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default as default_config
from grpo_jax import losses
from grpo_jax.metrics import read_metrics
from grpo_jax.models import ModelConfig, Transformer
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rl.rollout import Rollout
from grpo_jax.stages import default_section
from grpo_jax.stages.onpolicy_distill import distill_loss
from grpo_jax.training import Policy


def test_the_reverse_kl_gradient_is_its_definitions():
    """d/dz_s sum_v p_s (log p_s - log p_t) = p_s (log p_s - log p_t - KL), by hand."""
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    grad = np.asarray(jax.grad(lambda z: jnp.sum(losses.full_kl(z, jnp.asarray(teacher))))(
        jnp.asarray(student)))
    log_s = student - np.log(np.exp(student).sum(-1, keepdims=True))
    log_t = teacher - np.log(np.exp(teacher).sum(-1, keepdims=True))
    p = np.exp(log_s)
    kl = (p * (log_s - log_t)).sum(-1, keepdims=True)
    np.testing.assert_allclose(grad, p * (log_s - log_t - kl), rtol=1e-5, atol=1e-7)


def _policy(seed, **shape):
    config = dict(vocab_size=12, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=8, mlp_size=32, max_seq_len=16)
    model = Transformer(ModelConfig(**{**config, **shape}), rngs=nnx.Rngs(seed))
    return Policy.from_model(model)


def _batch(rows=4, prompt_len=3, new=5, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, 12, (rows, prompt_len + new)), jnp.int32)
    mask = jnp.asarray(np.arange(new)[None] < rng.integers(1, new + 1, rows)[:, None])
    return Rollout(prompt_tokens=tokens[:, :prompt_len],
                   prompt_mask=jnp.ones((rows, prompt_len), bool),
                   tokens=tokens[:, prompt_len:], attention_mask=mask, loss_mask=mask,
                   behaviour_logp=jnp.zeros((rows, new), jnp.float32),
                   rewards=jnp.zeros(rows, jnp.float32), version=0).to_batch()


def test_the_loss_is_the_token_mean_reverse_kl_to_a_teacher_of_another_size():
    (student, params), (teacher, teacher_params) = _policy(0), _policy(1, num_layers=2,
                                                                      hidden_size=24)
    batch, prompt_len = _batch(), 3
    num_tokens = jnp.sum(batch.loss_mask).astype(jnp.float32)
    loss, metrics = distill_loss(params, batch, student=student, teacher=teacher,
                                 teacher_params=teacher_params, prompt_len=prompt_len,
                                 num_tokens=num_tokens)
    # numpy, from the two models' logits at the positions that predict completion tokens
    def log_probs(policy, p):
        logits = policy.bind(p)(batch.tokens, attention_mask=batch.attention_mask)
        return np.asarray(jax.nn.log_softmax(logits, -1))[:, prompt_len - 1:-1]

    log_s, log_t = log_probs(student, params), log_probs(teacher, teacher_params)
    kl = (np.exp(log_s) * (log_s - log_t)).sum(-1)
    mask = np.asarray(batch.loss_mask)
    np.testing.assert_allclose(loss, kl[mask].sum() / mask.sum(), rtol=1e-5)
    assert float(loss) > 0
    # the teacher's own distribution: zero loss, zero gradient
    same = jax.grad(lambda p: distill_loss(p, batch, student=student, teacher=student,
                                           teacher_params=params, prompt_len=prompt_len,
                                           num_tokens=num_tokens)[0])(params)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(same)) < 1e-6
    moved = jax.grad(lambda p: distill_loss(p, batch, student=student, teacher=teacher,
                                            teacher_params=teacher_params,
                                            prompt_len=prompt_len,
                                            num_tokens=num_tokens)[0])(params)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(moved)) > 0


@pytest.mark.slow
def test_a_student_learns_from_another_runs_policy_on_its_own_samples(tmp_path):
    """The teacher: a pretrained run of two blocks; the student: a pretrained run of one
    block, distilled on its own samples for 4 steps. The reverse KL is positive, has a
    gradient, and the learner's log-probs of the sampled tokens are the sampler's; a bad
    teacher path is one line."""
    from grpo_jax.runner.validation import ConfigError, validate
    from grpo_jax.stages import KINDS

    teacher = default_config.get_config("smoke")
    teacher.stages = "pretrain"
    teacher.model.num_layers = 2
    teacher.pretrain.steps = 20
    teacher.mesh.num_devices = 1
    train_and_evaluate(teacher, str(tmp_path / "teacher"))

    config = default_config.get_config("smoke")
    config.model.num_layers = 1
    config.mesh.num_devices = 1
    config.onpolicy_distill = default_section("onpolicy_distill")
    config.onpolicy_distill.update(dict(teacher=str(tmp_path / "teacher"), steps=4,
                                        num_prompts=8, group_size=2, max_new_tokens=24,
                                        lr=1e-3, checkpoint_every=2))
    config.stages = "pretrain,onpolicy_distill"
    train_and_evaluate(config, str(tmp_path / "student"))
    rows = [r for r in read_metrics(tmp_path / "student" / "metrics.jsonl")
            if r.get("stage") == "onpolicy_distill"]
    assert len(rows) == 4
    assert all(r["reverse_kl"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert max(r["logp_diff_max"] for r in rows) < 1e-4
    assert "reward_mean" in rows[0]
    config.onpolicy_distill.teacher = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="onpolicy_distill.teacher: .*nowhere.* is not a "
                                          "finished grpo_jax run"):
        validate(config, KINDS)
