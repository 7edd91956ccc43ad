"""LoRA (grpo_jax.models.lora): the merge, the adapter gradients against full fine-tuning,
training that moves the adapters only, export of the merged weights, resume, validation."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import main as main_lib
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.models import Transformer, logprobs, lora, named_config
from grpo_jax.sft.data import TokenBatch
from grpo_jax.sft.loss import make_supervised_step
from grpo_jax.training import (Policy, accumulate_gradients, init_opt_state,
                               make_optimizer)

from configs import default as default_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL = tuple(lora.TARGETS)


def _tiny(num_layers=1):
    """(Policy, params) of a small model over 16 symbols."""
    model = Transformer(named_config("tiny-1m", vocab_size=16, hidden_size=32,
                                     num_layers=num_layers, num_heads=2, num_kv_heads=1,
                                     head_dim=16, mlp_size=64, max_seq_len=16),
                        rngs=nnx.Rngs(0))
    return Policy.from_model(model)


def _with_lora(policy, base, *, rank=4, alpha=8.0, targets=ALL, b_scale=0.0):
    """(LoRA policy, LoRA tree); B random with std `b_scale` (0: the fresh B = 0)."""
    adapters = lora.init_adapters(base, jax.random.key(1), rank=rank, targets=targets)
    for i, (_, pair) in enumerate(_pairs(adapters) if b_scale else []):
        pair["b"] = b_scale * jax.random.normal(jax.random.key(2 + i), pair["b"].shape)
    spec = lora.LoraConfig(rank=rank, alpha=alpha, targets=tuple(targets))
    return dataclasses.replace(policy, lora=spec), lora.combine(base, adapters)


def _tokens(rows=4, length=12, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 16, (rows, length)), jnp.int32)


def _pairs(tree, prefix=()):
    """(path, {"a", "b"}) of every adapter pair."""
    if set(tree) == {"a", "b"}:
        return [(prefix, tree)]
    return [p for k, sub in tree.items() for p in _pairs(sub, prefix + (k,))]


def _int_keys(tree):
    if not isinstance(tree, dict):
        return tree
    return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v)
            for k, v in tree.items()}


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def test_merge_treats_leading_axes_as_stacked_layers():
    rng = np.random.default_rng(0)
    base = {"q_kernel": jnp.asarray(rng.normal(size=(3, 8, 2, 4)), jnp.float32),
            "o_kernel": jnp.asarray(rng.normal(size=(3, 2, 4, 8)), jnp.float32),
            "scale": jnp.ones((3, 8))}
    adapters = lora.init_adapters(base, jax.random.key(0), rank=2,
                                  targets=("q_kernel", "o_kernel"))
    assert adapters["q_kernel"]["a"].shape == (3, 8, 2)
    assert adapters["q_kernel"]["b"].shape == (3, 2, 8)
    assert adapters["o_kernel"]["a"].shape == (3, 8, 2)
    for pair in adapters.values():
        pair["b"] = jnp.asarray(rng.normal(size=pair["b"].shape), jnp.float32)
    merged = jax.jit(lora.merge, static_argnames=("alpha", "rank"))(base, adapters,
                                                                     alpha=4.0, rank=2)
    for name in ("q_kernel", "o_kernel"):
        a, b = np.asarray(adapters[name]["a"]), np.asarray(adapters[name]["b"])
        for layer in range(3):
            want = np.asarray(base[name][layer]) + 2.0 * (a[layer] @ b[layer]).reshape(
                base[name].shape[1:])
            np.testing.assert_allclose(np.asarray(merged[name][layer]), want, rtol=1e-5,
                                       atol=1e-5)
    np.testing.assert_array_equal(np.asarray(merged["scale"]), np.asarray(base["scale"]))


def test_fresh_adapters_give_the_base_forward_and_gradients_are_the_chain_rule():
    """B = 0: the LoRA forward is the base's, bit for bit. B != 0: dL/dA = s dL/dW B^T and
    dL/dB = s A^T dL/dW, with dL/dW the full model's gradient at W + s A B."""
    policy, base = _tiny()
    lora_policy, fresh = _with_lora(policy, base)
    tokens = _tokens()
    mask = jnp.ones(tokens.shape, bool)

    def loss(p, batch, pol):
        logp = logprobs(pol.bind(p), batch, mask)["logp"]
        return -jnp.mean(logp), {"logp": logp}

    adapter_grads = jax.jit(lambda p: accumulate_gradients(
        lambda q, b: loss(q, b, lora_policy), p, tokens, 1))
    full_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, tokens, policy), has_aux=True))

    _, grads, metrics = adapter_grads(fresh)
    (_, base_metrics), _ = full_grads(base)
    np.testing.assert_array_equal(np.asarray(metrics["logp"]), np.asarray(base_metrics["logp"]))
    assert {path[-1] for path, _ in _pairs(fresh["lora"])} == set(ALL)
    assert "embedding" not in fresh["lora"]

    _, params = _with_lora(policy, base, b_scale=0.05)
    _, grads, _ = adapter_grads(params)
    assert jax.tree.structure(grads) == jax.tree.structure(params["lora"])  # no base grads
    _, full = full_grads(lora.merge(base, params["lora"], alpha=8.0, rank=4))
    s = 8.0 / 4
    for path, pair in _pairs(params["lora"]):
        a, b = np.asarray(pair["a"]), np.asarray(pair["b"])
        dw = np.asarray(_at(full, path)).reshape(a.shape[0], b.shape[1])
        got = _at(grads, path)
        np.testing.assert_allclose(np.asarray(got["a"]), s * dw @ b.T, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(np.asarray(got["b"]), s * a.T @ dw, rtol=1e-4, atol=1e-7)


def test_sft_steps_lower_the_loss_and_move_only_the_adapters():
    policy, base = _tiny()
    lora_policy, params = _with_lora(policy, base, targets=("q_kernel", "v_kernel",
                                                            "down_kernel"))
    before = jax.tree.map(np.array, base)
    optimizer, _ = make_optimizer(lr=3e-2, steps=8, warmup_frac=0.0, final_lr_frac=1.0)
    opt_state = init_opt_state(optimizer, params)
    sizes = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim)
    assert sizes == 2 * lora.num_adapter_params(params["lora"])  # Adam's two moments only
    tokens = _tokens(rows=8)
    mask = jnp.ones(tokens.shape, bool)
    batch = TokenBatch(tokens, mask, mask)
    step = make_supervised_step(lora_policy, optimizer)
    losses = []
    for _ in range(8):
        params, opt_state, metrics = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
        assert metrics["skipped"] == 0
    assert losses[-1] < losses[0] - 0.05, losses
    assert params["base"] is base  # never copied, donated or returned by the step
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, base), before)
    assert any(np.any(np.asarray(p["b"]) != 0) for _, p in _pairs(params["lora"]))


def test_a_reference_copy_shares_the_base():
    params = _with_lora(*_tiny(), targets=("q_kernel",))[1]
    ref = lora.copy_trainable(params)
    assert ref["base"] is params["base"]
    pair, ref_pair = _pairs(params["lora"])[0][1], _pairs(ref["lora"])[0][1]
    assert ref_pair["a"] is not pair["a"]
    np.testing.assert_array_equal(np.asarray(ref_pair["a"]), np.asarray(pair["a"]))
    detached, bases = lora.detach_bases({"params": params, "ref": ref, "n": 1})
    assert set(detached["params"]) == {"lora"} and len(bases) == 2
    assert lora.attach_bases(detached, bases)["ref"]["base"] is params["base"]


def _lora_config(**model):
    config = default_config.get_config("smoke")
    config.model.num_layers = 1
    config.model.lora_rank = 4
    for key, value in model.items():
        config.model[key] = value
    return config


def test_sft_then_rl_resume_bit_exactly_and_export_the_merged_weights(tmp_path,
                                                                     crash_and_resume):
    """SFT then GRPO with LoRA, crashed in RL and resumed: the adapters end bit-identical to
    an uninterrupted run's; checkpoints hold no base; the export is merge(base, adapters)."""
    from grpo_jax.export import export
    from grpo_jax.models import from_pretrained
    from grpo_jax.runner import validate
    from grpo_jax.runner.model_init import build_model
    from grpo_jax.stages import KINDS, default_section

    config = _lora_config(lora_targets=("q_kernel", "v_kernel", "o_kernel", "up_kernel"))
    config.stages = "sft,rl"
    config.optim.warmup_frac = 0.0
    config.sft = default_section("sft")
    config.sft.update(steps=1, batch_size=8, num_examples=16, lr=1e-2)
    config.rl.update(steps=4, checkpoint_every=2, beta=0.04, max_new_tokens=16)
    rows_straight, rows_resumed = crash_and_resume(config, "rl")
    assert [r["loss"] for r in rows_straight] == [r["loss"] for r in rows_resumed]
    count = lora.num_adapter_params(lora.init_adapters(
        nnx.to_pure_dict(nnx.state(build_model(config, validate(config, KINDS).tokenizer)[1])),
        jax.random.key(0), rank=4, targets=config.model.lora_targets))
    report = (tmp_path / "straight" / "report.md").read_text()
    assert f"LoRA: rank 4, alpha 16 on q_kernel, v_kernel, o_kernel, up_kernel: {count:,} " \
        "trainable float32 parameters" in report
    assert all(np.isfinite(r["kl_ref"]) for r in rows_straight)
    with Checkpointer(tmp_path / "straight" / "checkpoints") as checkpointer:
        mid = [s for s in checkpointer.all_steps()
               if not checkpointer.restore_meta(s)["stage_done"]][0]
        state, _ = checkpointer.restore(mid)  # the RL learner's full state
        final, _ = checkpointer.restore()
        final_step = checkpointer.latest_step()
    assert set(state["params"]) == set(state["ref_params"]) == {"lora"}  # no base saved
    assert sum(x.size for x in jax.tree.leaves(state["opt_state"]) if x.ndim) == \
        2 * lora.num_adapter_params(state["params"]["lora"])
    adapters = _int_keys(final["params"]["lora"])  # restored without a target: "0" keys
    assert all(np.any(np.asarray(p["b"]) != 0) for _, p in _pairs(adapters))

    line = export(str(tmp_path / "straight"), str(tmp_path / "out"))
    assert line.startswith(f"exported the policy after stage 'rl' (4 steps), checkpoint "
                           f"{final_step} of ")
    model, _ = from_pretrained(str(tmp_path / "out"))
    _, base_model = build_model(config, validate(config, KINDS).tokenizer)  # the run's base
    want = lora.merge(nnx.to_pure_dict(nnx.state(base_model)), adapters, alpha=16.0, rank=4)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                                         rtol=1e-6, atol=1e-7),
                 nnx.to_pure_dict(nnx.state(model)), want)


def _cli(*args) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", *args])
    return code, err.getvalue()


@pytest.mark.parametrize("config,flags_,needle", [
    ("default.py", "--config.model.lora_rank=-1", "model.lora_rank: expected >= 0"),
    ("default.py", "--config.model.lora_alpha=0", "model.lora_alpha: expected a value in"),
    ("default.py", "--config.model.lora_targets=q_kernel,x_kernel",
     "model.lora_targets: expected kernel names out of"),
    ("default.py", "--config.model.lora_targets=q_kernel,q_kernel",
     "model.lora_targets: a kernel is named twice"),
    ("ppo.py", "--config.model.lora_rank=8",
     "ppo.kind: LoRA (model.lora_rank 8) is not supported for stage kind 'ppo'"),
])
def test_bad_lora_fields_exit_2_with_one_line(tmp_path, config, flags_, needle):
    workdir = tmp_path / "run"
    code, err = _cli(f"--config={os.path.join(REPO, 'configs', config)}:smoke", flags_,
                     f"--workdir={workdir}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not workdir.exists()


def test_export_names_the_stage_that_trained_the_policy():
    from grpo_jax.config_presets import main_job
    from grpo_jax.export import exported_policy

    config = main_job("smoke")  # pretrain, eval_base, rl, eval_final
    words = exported_policy(config, {"stage": "eval_final", "global_step": 9})
    assert words == ("the policy after stage 'rl' (2 steps), checkpoint 9 (written by stage "
                     "'eval_final', which does not change it)")
    assert exported_policy(config, {"stage": "pretrain", "global_step": 4}) == (
        "the policy after stage 'pretrain' (3 steps), checkpoint 4")
    config.stages = "eval_final"
    assert exported_policy(config, {"stage": "eval_final", "global_step": 1}).startswith(
        "the initial policy (model.init_from or a fresh init; checkpoint 1")
