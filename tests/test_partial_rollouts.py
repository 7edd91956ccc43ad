"""Partial rollouts (rl.partial_tokens, `runner.partial`): the continuation layout by hand,
continued tokens' log-probs against a full forward pass, and a run that carries rows across
updates (per-token versions within the staleness bound, real gradients) and resumes
bit-exactly with its unfinished rows after a kill."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.metrics import read_metrics
from grpo_jax.models import ModelConfig, Transformer
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.runner.partial import continuation_prompts
from grpo_jax.sampling import SamplingConfig, generate, pad_prompts

from tests.test_guards import (assert_same_params, final_params, killed_and_resumed,
                               rl_config)
from tests.test_off_policy import _same_rows

# the run tests share one uninterrupted run (a module fixture): one worker runs them
RUN_GROUP = pytest.mark.xdist_group("partial_run")


@pytest.mark.parametrize("kind", ["rl", "ppo"])
def test_the_partial_source_declares_what_it_cannot_do_in_its_check(kind):
    """PartialSource.check (run by each kind's validate, as DeviceSource.check is) names
    partial_tokens for every field of its NEEDS set otherwise, a staleness bound under 1 and
    dynamic sampling; a config within its limits passes."""
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.partial import PartialSource
    from grpo_jax.runner.validation import validate
    from grpo_jax.stages import KINDS, default_section

    def config(**section):
        c = rl_config(max_staleness=1, partial_tokens=4)
        if kind == "ppo":
            c.ppo = default_section("ppo")
            c.ppo.update(dict(steps=4, max_new_tokens=12, max_staleness=1, partial_tokens=4))
            c.stages = "ppo"
            del c["rl"]
        c[kind].update(section)
        return c

    validate(config(), KINDS)
    with pytest.raises(ConfigError, match=rf"{kind}\.partial_tokens: a carried row's"):
        validate(config(max_staleness=0), KINDS)
    assert [field for field, _, _ in PartialSource.NEEDS] == ["tools", "fused_steps"]
    with pytest.raises(ConfigError, match=rf"{kind}\.partial_tokens: multi-turn episodes"):
        validate(config(tools="calc", max_observation_tokens=4), KINDS)
    if kind == "rl":
        with pytest.raises(ConfigError, match=r"rl\.partial_tokens: rows are carried on"):
            validate(config(fused_steps=2), KINDS)
        with pytest.raises(ConfigError, match=r"rl\.partial_tokens: dynamic sampling"):
            validate(config(algorithm="dapo"), KINDS)


def test_continuation_prompts_put_prompt_and_written_tokens_flush_right():
    prompt_tokens = np.array([[0, 7, 8], [5, 6, 9]], np.int32)
    prompt_mask = np.array([[False, True, True], [True, True, True]])
    tokens = np.array([[1, 2, 3, 0], [4, 0, 0, 0]], np.int32)
    out, mask = continuation_prompts(prompt_tokens, prompt_mask, tokens, np.array([2, 0]),
                                     pad_id=0)
    np.testing.assert_array_equal(out, [[0, 0, 0, 7, 8, 1, 2], [0, 0, 0, 0, 5, 6, 9]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])


def test_a_continued_row_has_the_log_probs_of_one_pass_over_prompt_and_completion():
    """Sample 3 tokens, continue 4 more from the continuation layout; the continued
    tokens' sampler log-probs equal the log-softmax of one uncached forward pass over
    [prompt | all 7 tokens] in the original layout (what the learner computes)."""
    config = ModelConfig(vocab_size=29, hidden_size=32, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=8, mlp_size=48, max_seq_len=64)
    model = Transformer(config, rngs=nnx.Rngs(0))
    model.embedding.value = model.embedding.value * 3
    graphdef, state = nnx.split(model)
    prompts, mask = pad_prompts([[1, 2, 3], [4, 5, 6, 7, 8], [9]], 5)
    first = generate(graphdef, state, prompts, mask, jax.random.key(1),
                     config=SamplingConfig(max_new_tokens=3))
    tokens = np.zeros((3, 7), np.int32)
    tokens[:, :3] = np.asarray(first.tokens)
    cont_prompts, cont_mask = continuation_prompts(np.asarray(prompts), np.asarray(mask),
                                                   tokens, np.full(3, 3), pad_id=0)
    second = generate(graphdef, state, cont_prompts, cont_mask, jax.random.key(2),
                      config=SamplingConfig(max_new_tokens=4))
    tokens[:, 3:] = np.asarray(second.tokens)
    full = jnp.concatenate([jnp.asarray(prompts), jnp.asarray(tokens)], 1)
    logits = nnx.merge(graphdef, state)(full, attention_mask=jnp.concatenate(
        [jnp.asarray(mask), jnp.ones((3, 7), bool)], 1))[:, 4:4 + 7]
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), full[:, 5:, None], -1)[..., 0]
    np.testing.assert_allclose(first.logp, expected[:, :3], atol=1e-4)
    np.testing.assert_allclose(second.logp, expected[:, 3:], atol=1e-4)


def _config():
    """A short pretraining (so rows end at different lengths), then 5 RL updates of 24
    tokens, 6 per update, with tokens at most 2 updates old; continuous batching in the
    sampler and packed updates on (they leave the samples and the gradient as they are:
    tests/test_sampling.py, tests/test_packing_rl.py)."""
    config = rl_config(steps=5, max_staleness=2, partial_tokens=6,
                       off_policy_correction="tis", slots=8, pack_blocks=8)
    config.rl.max_new_tokens = 24
    config.stages = "pretrain,rl"
    config.pretrain.steps = 60
    return config


def _rl_rows(workdir):
    return [r for r in read_metrics(workdir / "metrics.jsonl") if r["stage"] == "rl"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("partial")
    train_and_evaluate(_config(), str(workdir))
    return workdir


@RUN_GROUP
def test_rows_are_carried_across_updates_within_the_staleness_bound(straight):
    rows = _rl_rows(straight)
    assert len(rows) == 5
    # rows continued from an earlier update, trained with tokens of two versions
    assert any(r["carried_rows"] > 0 for r in rows)
    assert any(r["multi_version_frac"] > 0 for r in rows)
    assert all(0 <= r["staleness"] <= r["staleness_max"] <= 2 for r in rows)
    assert max(r["staleness_max"] for r in rows) >= 1
    # only done groups train; the rest of the batch is masked filler
    assert all(0 <= r["filled_groups"] < 4 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows) and any(r["reward_std"] > 0 for r in rows)
    assert max(r["is_weight_max"] for r in rows) > 1.0  # the per-token correction binds
    assert {r["packed"] for r in rows} <= {0.0, 1.0}


@RUN_GROUP
def test_a_killed_run_resumes_bit_exactly_with_its_unfinished_rows(straight, tmp_path,
                                                                    monkeypatch):
    """Killed while logging update 3 (checkpoint 2 holds rows in flight), the rerun
    restores them and ends as the uninterrupted run (metrics and parameters)."""
    rows = _rl_rows(straight)
    assert rows[1]["in_flight_rows"] > 0  # the checkpoint the rerun starts from has some
    workdir = tmp_path / "killed"
    killed_and_resumed(_config(), workdir, monkeypatch)
    _same_rows(_rl_rows(workdir), rows)
    assert_same_params(final_params(workdir), final_params(straight))
