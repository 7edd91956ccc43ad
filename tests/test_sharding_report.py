"""benchmarks/sharding_report.py at a tiny shape on the 8 virtual devices: the collectives of
the fsdp programs (weights gathered, activations and logits never all-reduced)."""

import importlib.util
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "sharding_report", os.path.join(ROOT, "benchmarks", "sharding_report.py"))
report = sys.modules["sharding_report"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

# A vocabulary and widths that no activation shape shares by accident.
VOCAB, HIDDEN, MLP = 96, 128, 384
PROMPTS, GROUP, PROMPT_LEN, NEW = 16, 4, 8, 16


_HLO = """\
HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %g = f32[8]{0} get-tuple-element((s32[], f32[8]{0}) %p), index=1
  %ag = f32[64]{0} all-gather(f32[8]{0} %g), channel_id=1, dimensions={0}
  %i = s32[] get-tuple-element((s32[], f32[8]{0}) %p), index=0
  ROOT %t = (s32[], f32[8]{0}) tuple(s32[] %i, f32[8]{0} %g)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %ar = (f32[8]{0}, bf16[4,2]{1,0}) all-reduce(f32[8]{0} %a, bf16[4,2]{1,0} %a), to_apply=%add
  %rs = f32[1]{0} reduce-scatter(f32[8]{0} %a), dimensions={0}, to_apply=%add
  %w = (s32[], f32[8]{0}) while((s32[], f32[8]{0}) %t0), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"5"}}
  %w2 = (s32[], f32[8]{0}) while((s32[], f32[8]{0}) %t0), condition=%cond, body=%body
  ROOT %out = f32[8]{0} copy(f32[8]{0} %a)
}
"""


def test_parse_collectives_counts_bytes_and_known_trip_counts():
    collectives, unknown = report.parse_collectives(_HLO)
    by_kind = {}
    for c in collectives:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + c.nbytes * c.count
    assert by_kind == {"all-reduce": 8 * 4 + 8 * 2, "reduce-scatter": 4,
                       "all-gather": 64 * 4 * 5 + 64 * 4}
    assert unknown == 1  # the second loop has no trip count: its all-gather counted once


@pytest.fixture(scope="module")
def results():
    import jax

    if jax.device_count() < 8:
        pytest.skip("needs the 8 virtual devices of tests/conftest.py")
    config = report.load_config(os.path.join(ROOT, "configs", "gsm8k.py:tpu"), [
        f"rl.num_prompts={PROMPTS}", f"rl.group_size={GROUP}", f"rl.max_new_tokens={NEW}",
        "model.logprob_chunk_size=8"])
    model_config = report.model_config_for(config, "tiny-1m", vocab_size=VOCAB,
                                           hidden_size=HIDDEN, mlp_size=MLP, num_layers=2,
                                           max_seq_len=PROMPT_LEN + NEW)
    setup = report.build_setup(config, model_config, num_devices=8, prompt_len=PROMPT_LEN)
    assert dict(setup.mesh.shape)["fsdp"] == 8
    return setup, report.report(setup, ("update", "reference", "decode"))


def _arrays(collective):
    return [tuple(int(d) for d in dims.split(",") if d)
            for _, dims in report._ARRAY.findall(collective.shape)]


def test_fsdp_gathers_weights_and_never_all_reduces_activations(results):
    setup, summaries = results
    params = setup.model_config.num_params()
    for name in ("update", "reference"):
        summary = summaries[name]
        gathered = {a for c in summary["collectives"] if c.kind == "all-gather"
                    for a in _arrays(c)}
        # FSDP: each block's MLP kernels are gathered whole from their embed shards, inside
        # the layer scan (the preset scans its layers): once per layer and pass.
        assert {(HIDDEN, MLP), (MLP, HIDDEN)} & gathered, (name, gathered)
        for c in summary["collectives"]:
            if c.kind == "all-gather" and {(HIDDEN, MLP), (MLP, HIDDEN)} & set(_arrays(c)):
                assert not c.computation.startswith("main") and c.count % 2 == 0, (
                    name, c.computation, c.count)
        for c in summary["collectives"]:
            if c.kind != "all-reduce":
                continue
            for shape in _arrays(c):
                # No logits (a vocabulary column without the hidden width: [rows, V],
                # [rows, chunk, V]); gradients of the [V, D] embedding are fine.
                assert VOCAB not in shape or HIDDEN in shape, (name, c.shape)
                # No activations (rows x MLP width of the block's inner layer).
                assert not (MLP in shape and HIDDEN not in shape), (name, c.shape)
    update, reference = summaries["update"], summaries["reference"]
    # The update all-reduces the float32 gradients and scalars: at most twice each (a block
    # runs on the shared prompts and on the completions, and XLA:CPU reduces the two
    # partial gradients separately).
    assert update["all_reduce"] <= 2 * 4 * params + 4096, update["all_reduce"]
    # The reference pass has no gradients: only scalars and per-row values are reduced.
    assert reference["all_reduce"] <= 64 * 1024, reference["all_reduce"]
    # The sampler's rollout layout: weights gathered once before the decode loop, rows
    # split over the batch axes, so a decode step has no collective at all.
    assert summaries["decode"]["collectives"] == [], summaries["decode"]["collectives"]
    for summary in summaries.values():
        assert summary["loops_unknown"] == 0
        assert math.isfinite(summary["temp"]) and summary["temp"] > 0


def test_report_line_format(results):
    _, summaries = results
    line = report.format_line("update", summaries["update"])
    assert line.startswith("update: temp_per_device_gib=")
    for key in ("all_reduce_gib=", "all_gather_gib=", "reduce_scatter_gib="):
        assert key in line


def test_sharded_model_constrains_activations_with_unchanged_numerics():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from grpo_jax import models, parallel

    config = models.named_config("tiny-1m", num_layers=2, vocab_size=VOCAB)
    model = models.Transformer(config, rngs=nnx.Rngs(0))
    rows, prompt = 8, 4
    prompts = jax.random.randint(jax.random.key(1), (rows // 2, prompt), 0, VOCAB)
    tokens = jnp.concatenate([jnp.repeat(prompts, 2, axis=0),
                              jax.random.randint(jax.random.key(2), (rows, 6), 0, VOCAB)], 1)
    mask = jnp.ones(tokens.shape, bool).at[1::2, -2:].set(False)

    def loss(model, tokens, mask):
        out = models.completion_logprobs(model, tokens, mask, prompt, group_size=2,
                                         chunk_size=4, chunk_rows=1, return_entropy=True)
        return jnp.sum(out["logp"]) + 0.1 * jnp.sum(out["entropy"]), out["logp"]

    def run(model, tokens, mask):
        (_, logp), grads = nnx.value_and_grad(loss, has_aux=True)(model, tokens, mask)
        full = models.logprobs(model, tokens, mask, chunk_size=4)["logp"]
        return logp, full, nnx.to_pure_dict(grads)

    expected = jax.jit(run)(model, tokens, mask)
    assert model.activation_sharding is None
    one = parallel.make_mesh({"data": 1}, devices=jax.devices()[:1])
    assert parallel.shard_model_state(model, one).activation_sharding is None

    # With the vocabulary split over tensor the head's tiles run under GSPMD; with it whole
    # each device runs the tiles of its own rows (shard_map).
    for shape in ({"data": 2, "fsdp": 2, "tensor": 2}, {"data": 2, "fsdp": 4, "tensor": 1}):
        mesh = parallel.make_mesh(shape)
        sharded = parallel.shard_model_state(
            models.Transformer(config, rngs=nnx.Rngs(0)), mesh)
        assert sharded.activation_sharding == parallel.ActivationSharding(
            mesh, parallel.DEFAULT_RULES)
        placed = jax.device_put((tokens, mask), parallel.data_sharding(mesh))
        text = jax.jit(run).lower(sharded, *placed).as_text()
        assert "sharding_constraint" in text or "@Sharding" in text  # Shardy or GSPMD
        assert ("shard_map" in text or "manual" in text) == (shape["tensor"] == 1), shape
        got = jax.jit(run)(sharded, *placed)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def test_sampler_rollout_layout_gives_the_one_device_samples():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from grpo_jax import models, parallel
    from grpo_jax.sampling import sampler

    config = models.named_config("tiny-1m", num_layers=2, vocab_size=VOCAB)
    prompts = jnp.repeat(jax.random.randint(jax.random.key(1), (4, 6), 1, VOCAB), 4, axis=0)
    mask = jnp.ones(prompts.shape, bool).at[:4, :2].set(False)
    sampling = sampler.SamplingConfig(max_new_tokens=20, eos_ids=(3,), prompt_group=4,
                                      cache_phases=2)

    def sample(model):
        return sampler.generate(*nnx.split(model), prompts, mask, jax.random.key(5),
                                config=sampling)

    expected = sample(models.Transformer(config, rngs=nnx.Rngs(0)))
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    got = sample(parallel.shard_model_state(models.Transformer(config, rngs=nnx.Rngs(0)), mesh))
    assert got.tokens.sharding.spec == parallel.data_sharding(mesh).spec  # rows stay split
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expected.tokens))
    np.testing.assert_allclose(np.asarray(got.logp), np.asarray(expected.logp), atol=1e-5)
    assert int(np.asarray(expected.lengths).min()) < 20  # some rows ended early


def test_rollout_rules_drop_the_batch_axes_from_parameters_only():
    from grpo_jax import parallel

    rules = dict(parallel.rollout_rules(parallel.DEFAULT_RULES))
    assert rules["batch"] == ("data", "fsdp")
    assert rules["embed"] is None and rules["mlp"] == "tensor"
    assert dict(parallel.rollout_rules([("embed", ("fsdp", "tensor"))])) == {"embed": "tensor"}
