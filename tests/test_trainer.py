"""The RL trainer and the staged main job on a shrunken default config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.runner import ConfigError
from grpo_jax.runner import validate as validate_with
from grpo_jax.stages import KINDS
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.rl.algorithms import ALGORITHMS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import default as default_config  # noqa: E402


def smoke_config(**rl):
    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1  # the sharded run is tested once, in the main-job smoke test
    config.model.num_layers = 1  # one block: the trainer's logic, at a fraction of the compile
    for key, value in rl.items():
        config.rl[key] = value
    return config


def rl_only(config):
    config.stages = "rl"
    return config


def test_main_job_smoke_writes_report(tmp_path):
    config = default_config.get_config("smoke")
    config.mesh.shape = {"data": 2, "fsdp": 2, "tensor": 2}  # all 8 test devices
    config.model.num_layers = 1  # one block: the job's logic, at a fraction of the compile
    summary = train_and_evaluate(config, str(tmp_path))
    assert {"before", "after"} <= set(summary)
    for name in ("report.md", "report.json", "metrics.jsonl", "config.json"):
        assert (tmp_path / name).exists(), name
    report = json.loads((tmp_path / "report.json").read_text())
    assert 0.0 <= report["summary"]["after"]["pass@1"] <= 1.0
    stages = [r["stage"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert stages.count("pretrain") == 3 and stages.count("rl") == 2
    rl_lines = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    for key in ("reward_mean", "clip_frac", "completion_length", "loss", "grad_norm",
                "learning_rate", "step_time_s"):
        assert np.isfinite(rl_lines[-1][key]), key
    # The smoke preset's steps have real gradients (rewards that differ within groups).
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in rl_lines)
    # A few generated texts of each eval and of the first RL step, with their rewards.
    samples = [json.loads(line)
               for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["stage"] for s in samples] == (["eval_base"] * 4 + ["rl"] * 4
                                             + ["eval_final"] * 4)
    for sample in samples:
        assert sample["prompt"] and isinstance(sample["completion"], str)
        assert {"reward", "accuracy", "format"} <= set(sample)
    assert samples[4]["step"] == rl_lines[0]["step"]  # logged at the first RL step
    for stage in ("eval_base", "eval_final"):  # one completion of each of 4 problems
        shown = [s for s in samples if s["stage"] == stage]
        assert len({s["prompt"] for s in shown}) == 4
        for s in shown:  # the training reward: rl.rewards' weights on the components
            weights = config.rl.rewards
            assert s["reward"] == pytest.approx(weights.accuracy * s["accuracy"]
                                                + weights.format * s["format"])
    assert report["summary"]["after"]["num_samples"] == config.eval_final.num_samples
    assert report["summary"]["after"]["num_completions"] == (
        config.task.eval_size * config.eval_final.num_samples)
    # no step at learning rate 0: the warmup's first step is lr / (warmup + 1)
    assert rl_lines[0]["learning_rate"] == pytest.approx(config.rl.lr / 2)
    # the time per stage: wall and compiling seconds, s/step without compiling, tokens/s
    timing = report["timing"]
    assert list(timing) == ["pretrain", "eval_base", "rl", "eval_final"]
    assert all(t["wall_s"] >= t["compile_s"] >= 0 for t in timing.values())
    assert timing["pretrain"]["steps"] == 3 and timing["rl"]["steps"] == 2
    assert timing["rl"]["s_per_step"] == pytest.approx(
        sum(r["step_time_s"] for r in rl_lines) / 2)
    assert timing["rl"]["tokens_per_s"] == pytest.approx(
        sum(r["completion_tokens"] for r in rl_lines) / sum(r["step_time_s"] for r in rl_lines))
    assert rl_lines[0]["completion_tokens"] == pytest.approx(
        rl_lines[0]["completion_length"] * config.rl.num_prompts * config.rl.group_size)
    assert timing["pretrain"]["tokens_per_s"] > 0 and "tokens_per_s" not in timing["eval_base"]
    assert "| stage | kind | wall s |" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_one_step_of_each_estimator(tmp_path, algorithm):
    """Every record of the table runs a step (the names come from the table itself)."""
    config = rl_only(smoke_config(algorithm=algorithm, steps=1, beta=0.04))
    train_and_evaluate(config, str(tmp_path))
    (line,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "rl"]
    assert np.isfinite(line["loss"]) and np.isfinite(line["grad_norm"])
    # The KL to the reference is computed at step 0 and is exactly zero there.
    assert line["kl_ref"] == pytest.approx(0.0, abs=1e-6)


def test_restart_gives_identical_parameters(crash_and_resume):
    config = rl_only(smoke_config(steps=4, checkpoint_every=2, beta=0.04))
    lines_a, lines_b = crash_and_resume(config, "rl")
    for ra, rb in zip(lines_a, lines_b):
        assert ra["reward_mean"] == rb["reward_mean"] and ra["loss"] == rb["loss"]


def test_same_seed_same_metrics(tmp_path):
    config = rl_only(smoke_config(steps=2))
    train_and_evaluate(config, str(tmp_path / "a"))
    train_and_evaluate(config, str(tmp_path / "b"))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("time_s") and  # noqa: E731
                           k != "wall_time"} for r in rows]
    assert strip(read_metrics(tmp_path / "a" / "metrics.jsonl")) == strip(
        read_metrics(tmp_path / "b" / "metrics.jsonl"))


def test_host_and_device_sources_run_one_iteration(tmp_path, monkeypatch):
    """GRPO with device rewards (accuracy, format) on the character tokenizer: the host
    source (fused_steps 0: one jitted iteration per step) and the device source (fused_steps
    2: two iterations per program) both run `GRPOLearner.iteration`, the one update, and log
    the same metrics: the same samples exactly, the updates up to float32 rounding."""
    from grpo_jax.stages.rl import GRPOLearner

    traced = []
    original = GRPOLearner.iteration

    def spy(self, state, batch):
        traced.append(isinstance(batch.tokens, jax.core.Tracer))
        return original(self, state, batch)

    monkeypatch.setattr(GRPOLearner, "iteration", spy)
    rows = {}
    for k in (0, 2):
        traced.clear()
        config = rl_only(smoke_config(steps=4, num_prompts=4, group_size=4, max_new_tokens=8,
                                      checkpoint_every=2, beta=0.04, entropy_coef=0.01,
                                      overlong_cache=0, fused_steps=k))
        config.rl.rewards = {"accuracy": 1.0, "format": 0.2}
        train_and_evaluate(config, str(tmp_path / f"k{k}"))
        rows[k] = [r for r in read_metrics(tmp_path / f"k{k}" / "metrics.jsonl")
                   if r["stage"] == "rl"]
        assert traced == [True], traced  # one trace: the host's jit, the device's scan body
    host, device = rows[0], rows[2]
    assert [r["stage_step"] for r in device] == [1, 2, 3, 4]
    for a, b in zip(host, device):
        for key in ("reward_mean", "reward/accuracy", "reward/format", "completion_length",
                    "truncated_frac", "pass@1", "zero_std_groups", "learning_rate",
                    "sampling_rounds"):
            assert a[key] == b[key], key
        for key in ("loss", "grad_norm", "entropy", "kl_ref", "clip_frac", "logp_diff_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    assert all(r["grad_norm"] > 0 for r in device) and device[-1]["kl_ref"] > 0


def _tiny_policy():
    """(Policy, params) of a one-block model over 16 symbols (update-level tests)."""
    from flax import nnx

    from grpo_jax.models import Transformer, named_config
    from grpo_jax.training import Policy

    model = Transformer(named_config("tiny-1m", vocab_size=16, hidden_size=32, num_layers=1,
                                     num_heads=2, num_kv_heads=1, head_dim=16, mlp_size=64,
                                     max_seq_len=16), rngs=nnx.Rngs(0))
    return Policy.from_model(model)


def test_micro_batches_and_streams_give_the_same_update():
    """1, 2 or 4 micro-batches, each in 1 or 3 row groups (3 of 4 rows: uneven), with each
    prompt run once per group of 2 or 4 rows sharing it or not: the same update, loss and
    metrics (`*_max` combined by maximum) up to float rounding. (Plain SGD, so the
    parameters move by the gradient itself: Adam's first step, g / |g|, would turn rounding
    in a near-zero gradient into a visible difference.)"""
    import dataclasses

    from grpo_jax.rl.rollout import Rollout
    from grpo_jax.rl.update import LossSettings, make_train_step
    from grpo_jax.sft.data import TokenBatch
    from grpo_jax.sft.loss import make_supervised_step

    policy, params = _tiny_policy()
    rng = np.random.default_rng(0)
    rows, prompt_len, new = 8, 4, 6
    tokens = rng.integers(0, 16, (rows, prompt_len + new)).astype(np.int32)
    tokens[:, :prompt_len] = np.repeat(tokens[::2, :prompt_len], 2, 0)  # pairs share a prompt
    tokens[4:8, :prompt_len] = tokens[4, :prompt_len]  # and rows 4-7 all four
    prompt_mask = np.ones((rows, prompt_len), bool)
    prompt_mask[4:, 0] = False  # some left padding
    lengths = rng.integers(0, new + 1, rows)
    completion_mask = np.arange(new)[None] < lengths[:, None]
    completion_mask = jnp.asarray(completion_mask)
    batch = Rollout(
        prompt_tokens=jnp.asarray(tokens[:, :prompt_len]), prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(tokens[:, prompt_len:]), attention_mask=completion_mask,
        loss_mask=completion_mask,
        behaviour_logp=jnp.asarray(-rng.uniform(0.5, 3.0, (rows, new)), jnp.float32),
        rewards=jnp.asarray(rng.normal(size=rows), jnp.float32), version=0).to_batch()
    batch = batch.with_advantages(batch.rewards).replace(
        ref_logp=jnp.asarray(-rng.uniform(0.5, 3.0, (rows, new)), jnp.float32),
        old_logp=jnp.asarray(-rng.uniform(0.5, 3.0, (rows, new)), jnp.float32))
    optimizer = optax.sgd(0.5)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm"):
        settings = LossSettings(beta=0.1, loss_agg=agg, on_policy=False)
        results = []
        # (micro-batches, streams, prompt groups) against one pass with nothing shared:
        # (4, 1, 2) one shared pair per micro-batch; on two aggregations (2, 3, 2), 2 row
        # groups of one pair each, and on one (2, 3, 1), uneven row groups of 1, 2, 1 rows
        layouts = ((1, 1, 1), (4, 1, 2)) + (((2, 3, 2),) if agg.endswith("mean") else ()) + (
            ((2, 3, 1),) if agg == "seq-mean-token-mean" else ())
        for micro, streams, group in layouts:
            step = make_train_step(dataclasses.replace(policy, batch_streams=streams),
                                   optimizer, settings, prompt_len=prompt_len,
                                   micro_batches=micro, group_size=group)
            p = jax.tree.map(jnp.copy, params)
            p, _, metrics = step(p, optimizer.init(p), batch)
            results.append((p, metrics))
        p1, m1 = results[0]
        for (p2, m2), layout in zip(results[1:], layouts[1:]):
            jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6),
                         p1, p2)
            for key in ("loss", "kl_ref", "logp_diff_max", "logp_diff_mean", "clip_frac"):
                np.testing.assert_allclose(m1[key], m2[key], rtol=1e-5, atol=1e-7,
                                           err_msg=f"{agg} {layout} {key}")
            np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-4)
    # The supervised step splits the same way (next-token loss over a loss mask).
    sft = TokenBatch(tokens=batch.tokens, attention_mask=batch.attention_mask,
                     loss_mask=batch.attention_mask)
    outs = []
    for streams in (1, 3):
        step = make_supervised_step(dataclasses.replace(policy, batch_streams=streams),
                                    optimizer)
        p = jax.tree.map(jnp.copy, params)
        outs.append(step(p, optimizer.init(p), sft))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6),
                 outs[0][0], outs[1][0])
    np.testing.assert_allclose(outs[0][2]["loss"], outs[1][2]["loss"], rtol=1e-6)


def test_prompt_groups_checked_and_sized():
    from grpo_jax.rl.update import prompt_group_for
    from grpo_jax.sampling import check_prompt_groups

    prompts = np.repeat(np.arange(12).reshape(3, 4), 2, 0)
    mask = np.ones_like(prompts, bool)
    check_prompt_groups(prompts, mask, 2)
    check_prompt_groups(prompts, mask, 1)
    with pytest.raises(ValueError, match=r"rows 0\.\.2 should share one prompt but their "
                                         r"prompt tokens differ"):
        check_prompt_groups(prompts, mask, 3)
    mask[3, 0] = False
    with pytest.raises(ValueError, match=r"rows 2\.\.3 .* prompt mask differ"):
        check_prompt_groups(prompts, mask, 2)
    with pytest.raises(ValueError, match="6 rows are not whole groups of 4"):
        check_prompt_groups(prompts, mask, 4)
    # A micro-batch of whole groups shares its prompts; otherwise nothing is shared.
    assert prompt_group_for(64, 8) == 8 and prompt_group_for(64, 8, micro_batches=8) == 8
    assert prompt_group_for(64, 8, micro_batches=16) == 1 and prompt_group_for(64, 1) == 1


def test_batch_streams_default_and_bounds():
    from grpo_jax.training import Policy, default_batch_streams
    from grpo_jax.models import Transformer, named_config
    from flax import nnx

    # The test process has 8 CPU devices: rows may be sharded, so one row group.
    assert jax.device_count() > 1 and default_batch_streams() == 1
    model = Transformer(named_config("tiny-1m", vocab_size=16, max_seq_len=16),
                        rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="batch_streams must be >= 1"):
        Policy.from_model(model, batch_streams=0)


@pytest.mark.parametrize("field,value,needle", [
    ("rl.group_size", 1, "rl.group_size"),
    ("rl.algorithm", "ppo2", "rl.algorithm"),
    ("rl.loss_agg", "mean", "rl.loss_agg"),
    ("rl.max_new_tokens", 500, "rl.max_new_tokens"),
    ("rl.num_minibatches", 3, "rl.num_minibatches"),
    ("pretrain.batch_size", 7, "pretrain.batch_size"),
    ("task.name", "nope", "task.name"),
    ("stages", "pretrain,missing", "stages"),
])
def test_config_errors_name_the_field(field, value, needle):
    config = default_config.get_config("smoke")
    section, _, key = field.rpartition(".")
    target = config[section] if section else config
    target[key] = value
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate_with(config, KINDS)


def test_config_error_exits_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_jax.main", "--config=configs/default.py:smoke",
         "--config.rl.group_size=1", f"--workdir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode != 0
    lines = [l for l in result.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and "rl.group_size" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_logprobs_temperature_matches_scaled_softmax():
    from flax import nnx

    from grpo_jax.models import Transformer, logprobs, named_config

    model = Transformer(named_config("tiny-1m", vocab_size=16, hidden_size=32, num_layers=1,
                                     num_heads=2, num_kv_heads=1, head_dim=16, mlp_size=64,
                                     max_seq_len=16), rngs=nnx.Rngs(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, 6)), jnp.int32)
    mask = jnp.ones((2, 6), bool)
    logits = model(tokens, attention_mask=mask)
    for temperature in (1.0, 0.5, 2.0):
        expected = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
        expected = jnp.take_along_axis(expected, tokens[:, 1:, None], axis=-1)[..., 0]
        got = logprobs(model, tokens, mask, temperature=temperature)["logp"]
        np.testing.assert_allclose(got[:, 1:], expected, rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(got[:, 0]) == 0.0)


def test_train_step_compiles_once(tmp_path):
    """Steps after the first reuse its executable: the optimizer state starts on the mesh."""
    from grpo_jax.runner import Run
    from grpo_jax.runner.toolkit import stage_optimizer
    from grpo_jax.sft.data import TokenBatch
    from grpo_jax.sft.loss import make_supervised_step
    from grpo_jax.training import init_opt_state

    config = default_config.get_config("smoke")
    config.mesh.shape = {"data": 2, "fsdp": 2, "tensor": 2}
    config.model.num_layers = 1
    run = Run(config, str(tmp_path), KINDS)
    try:
        optimizer, _ = stage_optimizer(run, lr=config.pretrain.lr, steps=10)
        opt_state = init_opt_state(optimizer, run.params, run.mesh)
        step = make_supervised_step(run.policy, optimizer)
        batch = jax.device_put(TokenBatch(tokens=np.ones((8, 16), np.int32),
                                          attention_mask=np.ones((8, 16), bool),
                                          loss_mask=np.ones((8, 16), bool)),
                               run.data_sharding)
        params = run.params
        for _ in range(3):
            params, opt_state, _ = step(params, opt_state, batch)
        assert step.jitted()._cache_size() == 1
    finally:
        run.close()


def test_chunked_logprobs_in_the_update_match_unchunked():
    import dataclasses

    from flax import nnx

    from grpo_jax.models import Transformer, named_config
    from grpo_jax.rl.update import make_logp_fn
    from grpo_jax.training import Policy

    model = Transformer(named_config("tiny-1m", vocab_size=16, hidden_size=32, num_layers=1,
                                     num_heads=2, num_kv_heads=1, head_dim=16, mlp_size=64,
                                     max_seq_len=16), rngs=nnx.Rngs(2))
    policy, params = Policy.from_model(model)
    chunked = dataclasses.replace(policy, logprob_chunk_size=3)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 16, (3, 11)), jnp.int32)
    mask = jnp.ones((3, 11), bool).at[0, :2].set(False)
    full = make_logp_fn(policy, prompt_len=4)(params, tokens, mask)
    parts = make_logp_fn(chunked, prompt_len=4)(params, tokens, mask)
    np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-6)


def test_per_sequence_score_grads_sum_to_the_batch_gradient_and_give_the_baseline():
    """The vmapped one-row gradients of log pi(y_i | x_i) sum to the gradient of the batched
    sum (another program: all rows in one forward), and their squared norms feed
    losses.optimal_baseline."""
    from grpo_jax import losses
    from grpo_jax.rl.update import (flat_sequence_score_grads, sequence_logp,
                                    sequence_score_grads, sequence_score_sq_norms)

    policy, params = _tiny_policy()
    rng = np.random.default_rng(1)
    rows, prompt_len, new = 4, 3, 5
    tokens = jnp.asarray(rng.integers(0, 16, (rows, prompt_len + new)), jnp.int32)
    attention = np.ones((rows, prompt_len + new), bool)
    attention[1, 0] = False  # left padding
    attention[2, -2:] = False  # a completion that ended early
    attention = jnp.asarray(attention)

    grads = sequence_score_grads(policy, params, tokens, attention, prompt_len)

    def batch_logp(p):
        logp, _ = sequence_logp(policy, p, tokens, attention, prompt_len)
        return jnp.sum(jnp.where(attention[:, prompt_len:], logp, 0.0))

    expected = jax.grad(batch_logp)(params)
    jax.tree.map(lambda g, e: np.testing.assert_allclose(np.sum(g, axis=0), e, rtol=1e-4,
                                                         atol=1e-5), grads, expected)
    norms = sequence_score_sq_norms(policy, params, tokens, attention, prompt_len)
    by_hand = [sum(float(np.sum(np.square(g[i]))) for g in jax.tree.leaves(grads))
               for i in range(rows)]
    np.testing.assert_allclose(norms, by_hand, rtol=1e-5)
    assert len(set(np.round(np.asarray(norms), 4))) == rows  # rows differ
    flat = np.asarray(flat_sequence_score_grads(policy, params, tokens, attention, prompt_len))
    count = sum(g[0].size for g in jax.tree.leaves(grads))
    assert flat.shape == (rows, count)
    np.testing.assert_array_equal(flat[2], np.concatenate(
        [np.asarray(g[2]).ravel() for g in jax.tree.leaves(grads)]))
    np.testing.assert_allclose(np.diag(flat @ flat.T), norms, rtol=1e-5)
    rewards = jnp.asarray([1.0, 0.0, 0.5, 2.0])
    baseline = losses.optimal_baseline(rewards, norms)
    assert float(baseline) == pytest.approx(float(jnp.sum(norms * rewards) / jnp.sum(norms)))
