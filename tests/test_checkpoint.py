"""Tests for grpo_jax.checkpoint (orbax CheckpointManager wrapper)."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from grpo_jax.checkpoint import (CheckpointIntegrityError, Checkpointer, CheckpointNotFoundError,
                                 checksums)


def _tree_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class _TinyMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(4, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _train_state(seed=0):
    """A realistic RL state: params (pure dict), AdamW state after one step, ref params, keys."""
    model = _TinyMLP(nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    tx = optax.adamw(1e-2, weight_decay=0.1)
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return {
        "params": params,
        "opt_state": opt_state,
        "ref_params": jax.tree.map(lambda x: x * 2.0, params),
        "rng": jax.random.key(seed),          # typed key
        "raw_rng": jax.random.PRNGKey(seed + 1),  # raw uint32 key
        "step": jnp.int32(7),
    }


def test_round_trip_with_target_optax_nnx_and_keys(tmp_path):
    state = _train_state()
    meta = {"stage": "rl", "step": 1, "data": {"index": 12, "epoch": 0}, "config_hash": "ab12"}
    ckpt = Checkpointer(tmp_path / "ckpt", async_=True)
    assert ckpt.latest_step() is None
    assert ckpt.save(1, state=state, meta=meta)
    ckpt.wait()
    assert ckpt.latest_step() == 1
    assert ckpt.restore_meta() == meta

    target = jax.tree.map(lambda x: jnp.zeros_like(x), _train_state(seed=5))
    restored, restored_meta = ckpt.restore(target=target)
    assert restored_meta == meta
    # The optax NamedTuple structure comes back (not a dict of lists).
    assert isinstance(restored["opt_state"], type(state["opt_state"]))
    assert jnp.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
    assert str(jax.random.key_impl(restored["rng"])) == "threefry2x32"
    np.testing.assert_array_equal(
        jax.random.key_data(restored["rng"]), jax.random.key_data(state["rng"])
    )
    # Same key -> same random numbers after restore.
    np.testing.assert_array_equal(
        jax.random.normal(restored["rng"], (3,)), jax.random.normal(state["rng"], (3,))
    )
    plain = lambda t: {k: v for k, v in t.items() if k != "rng"}
    _tree_equal(plain(restored), plain(state))
    # The restored params load back into an nnx model.
    model = _TinyMLP(nnx.Rngs(3))
    nnx.update(model, restored["params"])
    x = jnp.ones((1, 4))
    ref_model = _TinyMLP(nnx.Rngs(9))
    nnx.update(ref_model, state["params"])
    np.testing.assert_allclose(model(x), ref_model(x))
    ckpt.close()


def test_restore_without_target_wraps_typed_key(tmp_path):
    state = {"w": jnp.arange(6.0).reshape(2, 3), "key": jax.random.key(3)}
    with Checkpointer(tmp_path, async_=False) as ckpt:
        ckpt.save(0, state=state, meta={"stage": "sft"})
        restored, meta = ckpt.restore()
    assert meta == {"stage": "sft"}
    np.testing.assert_array_equal(restored["w"], np.arange(6.0).reshape(2, 3))
    assert jnp.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(
        jax.random.key_data(restored["key"]), jax.random.key_data(jax.random.key(3))
    )


def test_restore_onto_sharded_target_on_8_device_mesh(tmp_path):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    state = {"w": jnp.arange(32.0).reshape(4, 8), "b": jnp.arange(8.0), "key": jax.random.key(1)}
    with Checkpointer(tmp_path, async_=False) as ckpt:
        ckpt.save(3, state=state, meta={})
        w_sharding = NamedSharding(mesh, P("fsdp", "tensor"))
        b_sharding = NamedSharding(mesh, P("tensor"))
        target = {
            "w": jax.ShapeDtypeStruct((4, 8), jnp.float32, sharding=w_sharding),
            "b": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=b_sharding),
            "key": jax.eval_shape(lambda: jax.random.key(0)),
        }
        restored, _ = ckpt.restore(3, target=target)
    assert restored["w"].sharding == w_sharding
    assert restored["b"].sharding == b_sharding
    # Each device holds a (2, 4) block of w: rows split over fsdp, columns over tensor.
    assert {s.data.shape for s in restored["w"].addressable_shards} == {(2, 4)}
    np.testing.assert_array_equal(restored["w"], np.arange(32.0).reshape(4, 8))
    np.testing.assert_array_equal(restored["b"], np.arange(8.0))
    assert jnp.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)


def test_max_to_keep_and_interval(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=2, async_=False) as ckpt:
        state = {"x": jnp.zeros(())}
        written = [ckpt.save(s, state=state) for s in range(1, 7)]
        assert written == [False, True, False, True, False, True]
        assert ckpt.save(7, state=state, force=True)  # end-of-stage save off the interval
        assert ckpt.save(7, state=state, force=True) is False  # already saved: skipped
        assert ckpt.all_steps() == [6, 7]
        assert ckpt.latest_step() == 7


def test_unfinished_tmp_checkpoint_is_ignored(tmp_path):
    with Checkpointer(tmp_path, async_=False) as ckpt:
        ckpt.save(1, state={"x": jnp.ones(3)}, meta={"step": 1})
    # Simulate a save of step 2 killed half-way: orbax writes into a temporary directory
    # and renames it only when complete. Copy step 1 so the content itself is valid.
    tmp_dirs = [d for d in os.listdir(tmp_path) if "tmp" in d]
    assert tmp_dirs == []
    shutil.copytree(tmp_path / "1", tmp_path / "2.orbax-checkpoint-tmp-1234567")
    with Checkpointer(tmp_path, async_=False) as ckpt:
        assert ckpt.all_steps() == [1]
        assert ckpt.latest_step() == 1
        state, meta = ckpt.restore()
        assert meta == {"step": 1}
        np.testing.assert_array_equal(state["x"], np.ones(3))
        with pytest.raises(CheckpointNotFoundError, match="step 2 not found"):
            ckpt.restore(2)


def test_empty_dir_restore_error(tmp_path):
    with Checkpointer(tmp_path / "none", async_=False) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(CheckpointNotFoundError, match="no finished checkpoint in"):
            ckpt.restore()
        with pytest.raises(CheckpointNotFoundError, match="no finished checkpoint in"):
            ckpt.restore_meta()


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path, max_to_keep=0)
    with Checkpointer(tmp_path, async_=False) as ckpt:
        with pytest.raises(ValueError, match="step"):
            ckpt.save(-1, state={"x": jnp.ones(())})
        with pytest.raises(ValueError, match="meta: expected a JSON-serialisable"):
            ckpt.save(0, state={"x": jnp.ones(())}, meta={"bad": object()})
        ckpt.save(1, state={"x": jnp.ones(3)})
        with pytest.raises(ValueError, match="target"):
            ckpt.restore(target={"y": jax.ShapeDtypeStruct((3,), jnp.float32)})


def test_nnx_state_restores_onto_abstract_sharded_model(tmp_path):
    from grpo_jax.parallel import abstract_sharded_state, make_mesh

    def factory():
        return _TinyMLP(nnx.Rngs(0))

    model = factory()
    x = jnp.arange(8.0).reshape(2, 4)
    expected = model(x)
    with Checkpointer(tmp_path, async_=False) as ckpt:
        ckpt.save(5, state={"params": nnx.state(model).to_pure_dict()}, meta={"stage": "sft"})
        mesh = make_mesh({"data": 4, "tensor": 2})
        graphdef, abstract = abstract_sharded_state(factory, mesh)
        restored, meta = ckpt.restore(target={"params": abstract.to_pure_dict()})
    assert meta["stage"] == "sft"
    # Unannotated nnx.Linear params have no logical names: restored replicated on the mesh.
    kernel = restored["params"]["l1"]["kernel"]
    assert kernel.sharding == NamedSharding(mesh, P())
    nnx.replace_by_pure_dict(abstract, restored["params"])
    restored_model = nnx.merge(graphdef, abstract)
    np.testing.assert_allclose(restored_model(x), expected, rtol=1e-6)


def test_checksums_see_every_bit_and_not_the_sharding():
    x = jnp.arange(32, dtype=jnp.float32).reshape(4, 8) / 7
    base = checksums({"x": x})["['x']"]
    bits = np.asarray(x).view(np.uint32)
    for element in (0, 5, 31):  # every one of 32 bits of three elements, one at a time
        for bit in range(32):
            flipped = bits.copy()
            flipped.flat[element] ^= np.uint32(1 << bit)
            assert checksums({"x": flipped.view(np.float32)})["['x']"] != base, (element, bit)
    swapped = np.asarray(x).copy()
    swapped.flat[[2, 9]] = swapped.flat[[9, 2]]
    assert checksums({"x": swapped})["['x']"] != base
    # Integer sums are exact: the same value on 8 devices, and for bf16, ints and bools.
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharded = jax.device_put(x, NamedSharding(mesh, P("a", "b")))
    assert checksums({"x": sharded})["['x']"] == base
    others = checksums({"h": x.astype(jnp.bfloat16), "i": jnp.arange(5), "m": x > 1,
                        "key": jax.random.key(3)})
    assert set(others) == {"['h']", "['i']", "['m']", "['key']"}


def test_changed_array_files_are_refused_not_restored(tmp_path):
    """A checkpoint whose state files no longer hold what was saved (here: another save's
    files with one bit flipped in one parameter) is refused with one line."""
    state = {"params": {"w": jnp.arange(16, dtype=jnp.float32) / 3, "b": jnp.ones(4)},
             "rng": jax.random.key(0)}
    bits = np.asarray(state["params"]["w"]).view(np.uint32).copy()
    bits[5] ^= np.uint32(1 << 12)
    changed = {**state, "params": {**state["params"], "w": jnp.asarray(bits.view(np.float32))}}
    with Checkpointer(tmp_path, async_=False, max_to_keep=None) as ckpt:
        ckpt.save(1, state=state, meta={"stage": "rl"})
        ckpt.save(2, state=changed, meta={"stage": "rl"})
    shutil.rmtree(tmp_path / "1" / "state")
    shutil.copytree(tmp_path / "2" / "state", tmp_path / "1" / "state")
    with Checkpointer(tmp_path, async_=False) as ckpt:
        with pytest.raises(CheckpointIntegrityError,
                           match=r"checkpoint 1 .*array \['params'\]\['w'\] does not match"):
            ckpt.restore(1, target=state)
        with pytest.raises(CheckpointIntegrityError):  # without a target too
            ckpt.restore(1)
        restored, meta = ckpt.restore(2, target=state)  # the intact checkpoint restores
        assert meta == {"stage": "rl"}
        np.testing.assert_array_equal(restored["params"]["w"], changed["params"]["w"])
