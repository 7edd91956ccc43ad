"""Tests for grpo_jax.parallel on the 8 virtual CPU devices."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from grpo_jax import parallel
from grpo_jax.parallel import (
    DEFAULT_RULES,
    data_sharding,
    logical_to_mesh_spec,
    make_mesh,
    shard_model_state,
    sharded_init,
    state_shardings,
)


def _param(key, shape, names):
    return nnx.Param(jax.random.normal(key, shape) * 0.1, out_sharding=names,
                     eager_sharding=False)


class _Block(nnx.Module):
    """Tiny MLP with logical names like the transformer's: embed -> mlp -> embed, plus vocab."""

    def __init__(self, rngs, *, vocab=12, embed=8, mlp=16):
        self.embedding = _param(rngs.params(), (vocab, embed), ("vocab", "embed"))
        self.up = _param(rngs.params(), (embed, mlp), ("embed", "mlp"))
        self.down = _param(rngs.params(), (mlp, embed), ("mlp", "embed"))
        self.scale = _param(rngs.params(), (embed,), ("norm",))
        self.odd = _param(rngs.params(), (3, embed), ("some_unknown_name", "embed"))
        self.count = nnx.Variable(jnp.zeros((), jnp.int32))  # no names: replicated
        self.linear = nnx.Linear(
            embed, 4, rngs=rngs,
            kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"),
                                          eager_sharding=False),
        )

    def __call__(self, tokens):
        x = self.embedding[...][tokens]
        x = x + jax.nn.gelu(x @ self.up[...]) @ self.down[...]
        return self.linear(x * self.scale[...] + self.odd[...].sum(0))


def _mesh(data=2, fsdp=2, tensor=2):
    return make_mesh({"data": data, "fsdp": fsdp, "tensor": tensor})


# --------------------------------------------------------------------------- make_mesh
def test_make_mesh_fills_minus_one_and_uses_auto_axes():
    mesh = make_mesh()
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert mesh.axis_types == (AxisType.Auto,) * 3
    mesh = make_mesh({"data": -1, "fsdp": 2, "tensor": 2})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    explicit = make_mesh({"data": 4, "tensor": 2}, axis_types="explicit")
    assert explicit.axis_types == (AxisType.Explicit,) * 2
    small = make_mesh({"data": 2}, devices=jax.devices()[:2])
    assert small.devices.size == 2


def test_make_mesh_accepts_config_dict():
    ml_collections = pytest.importorskip("ml_collections")
    config = ml_collections.ConfigDict({"data": -1, "fsdp": 4, "tensor": 1})
    assert dict(make_mesh(config).shape) == {"data": 2, "fsdp": 4, "tensor": 1}


@pytest.mark.parametrize(
    "shape, message",
    [
        ({"data": 3, "fsdp": 1, "tensor": 1}, r"multiply to 3, expected the device count 8"),
        ({"data": -1, "fsdp": 3}, r"fixed axis sizes multiply to 3, which does not divide"),
        ({"data": -1, "fsdp": -1}, r"at most one axis may be -1"),
        ({"data": 0, "fsdp": -1}, r"mesh.data: expected a positive int or -1, got 0"),
        ({"data": "8"}, r"mesh.data: expected a positive int or -1"),
        ([8], r"mesh: expected a mapping"),
    ],
)
def test_make_mesh_errors(shape, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(shape)


# --------------------------------------------------------------------------- rules
def test_logical_to_mesh_spec_rules():
    # Without a mesh: the rule table as written; unknown names replicate.
    assert logical_to_mesh_spec(("vocab", "embed")) == P("tensor", "fsdp")
    assert logical_to_mesh_spec(("embed", "heads", "head_dim")) == P("fsdp", "tensor", None)
    assert logical_to_mesh_spec(("batch", "length")) == P(("data", "fsdp"), None)
    assert logical_to_mesh_spec(("never_heard_of_it", "mlp")) == P(None, "tensor")
    assert logical_to_mesh_spec(None) == P()
    assert logical_to_mesh_spec(()) == P()
    # An axis shards only one dimension: the second "mlp" falls back to the next rule.
    rules = (("mlp", "tensor"), ("mlp", "fsdp"))
    assert logical_to_mesh_spec(("mlp", "mlp"), rules) == P("tensor", "fsdp")
    assert logical_to_mesh_spec(("mlp", "mlp"), rules[:1]) == P("tensor", None)


def test_logical_to_mesh_spec_with_mesh_and_shape():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    # 2 kv heads over tensor=2 split; 3 kv heads cannot, so they replicate.
    names = ("embed", "kv_heads", "head_dim")
    assert logical_to_mesh_spec(names, mesh=mesh, shape=(8, 2, 4)) == P("fsdp", "tensor", None)
    assert logical_to_mesh_spec(names, mesh=mesh, shape=(8, 3, 4)) == P("fsdp", None, None)
    # Batch of 6 over data=2 x fsdp=2: fsdp would not divide 6/2=3, so only data is kept.
    assert logical_to_mesh_spec(("batch",), mesh=mesh, shape=(6,)) == P("data")
    assert logical_to_mesh_spec(("batch",), mesh=mesh, shape=(8,)) == P(("data", "fsdp"))
    # Axes absent from the mesh are dropped; a mesh axis name used directly passes through.
    data_only = make_mesh({"data": 8})
    assert logical_to_mesh_spec(("vocab", "embed"), mesh=data_only, shape=(16, 8)) == P(None, None)
    assert logical_to_mesh_spec(("data", "embed"), mesh=data_only, shape=(16, 8)) == P("data", None)
    with pytest.raises(ValueError, match="one logical name per dimension"):
        logical_to_mesh_spec(("embed",), mesh=mesh, shape=(8, 8))


def test_bad_rules():
    with pytest.raises(ValueError, match=r"rules\[1\]: expected \(logical_name"):
        logical_to_mesh_spec(("embed",), (("embed", "fsdp"), ("mlp", 3)))
    with pytest.raises(ValueError, match=r"rules\[0\]"):
        logical_to_mesh_spec(("embed",), ("embed",))


def test_default_rules_cover_model_names():
    names = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "layers", "batch",
             "length", "norm"}
    assert names <= {name for name, _ in DEFAULT_RULES}


# --------------------------------------------------------------------------- shard state
def test_shard_model_state_follows_rules():
    mesh = _mesh()
    model = _Block(nnx.Rngs(0))
    state = nnx.state(model)
    sharded = shard_model_state(state, mesh)
    expected = {
        "embedding": P("tensor", "fsdp"),
        "up": P("fsdp", "tensor"),
        "down": P("tensor", "fsdp"),
        "scale": P(None),
        "odd": P(None, "fsdp"),
        "count": P(),
    }
    for name, spec in expected.items():
        array = sharded[name][...]
        assert array.sharding == NamedSharding(mesh, spec), name
        np.testing.assert_array_equal(array, state[name][...])
    # nnx.Linear annotated via nnx.with_partitioning: kernel [8, 4] ("embed", "mlp").
    kernel = sharded["linear"]["kernel"][...]
    assert kernel.sharding == NamedSharding(mesh, P("fsdp", "tensor"))
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(4, 2)}
    assert sharded["linear"]["bias"][...].sharding == NamedSharding(mesh, P())
    # The Variables keep their metadata (logical names) after sharding.
    assert sharded["up"].get_metadata()["out_sharding"] == ("embed", "mlp")


def test_shard_model_state_on_module_in_place():
    mesh = _mesh()
    model = _Block(nnx.Rngs(0))
    tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
    before = model(tokens)
    assert shard_model_state(model, mesh) is model
    assert model.up[...].sharding == NamedSharding(mesh, P("fsdp", "tensor"))
    np.testing.assert_allclose(model(tokens), before, rtol=1e-6, atol=1e-6)


def test_sharded_init_equals_unsharded_init():
    mesh = _mesh()
    graphdef, state = sharded_init(lambda: _Block(nnx.Rngs(3)), mesh)
    reference = nnx.state(_Block(nnx.Rngs(3)))
    assert state["down"][...].sharding == NamedSharding(mesh, P("tensor", "fsdp"))
    # Same random bits; jit may fuse the init's scaling differently (1 ulp).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8),
                 state, reference)
    graphdef_abstract, abstract = parallel.abstract_sharded_state(
        lambda: _Block(nnx.Rngs(3)), mesh)
    assert isinstance(abstract["down"].get_value(), jax.ShapeDtypeStruct)
    assert abstract["down"].get_value().sharding == state["down"][...].sharding
    assert graphdef_abstract == graphdef


def test_jit_over_mesh_matches_unsharded():
    """A training-style step with in/out shardings equals the single-device computation."""
    mesh = _mesh(data=2, fsdp=2, tensor=2)
    model = _Block(nnx.Rngs(1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jax.random.randint(jax.random.key(0), (8, 5), 0, 12)
    targets = jax.random.normal(jax.random.key(1), (8, 5, 4))

    def loss_and_grad(params, rest, tokens, targets):
        def loss_fn(params):
            out = nnx.merge(graphdef, params, rest)(tokens)
            return jnp.mean((out - targets) ** 2)
        return jax.value_and_grad(loss_fn)(params)

    expected_loss, expected_grads = jax.jit(loss_and_grad)(params, rest, tokens, targets)

    param_shardings = state_shardings(params, mesh)
    rest_shardings = state_shardings(rest, mesh)
    batch = data_sharding(mesh)
    assert batch == NamedSharding(mesh, P(("data", "fsdp")))
    sharded_step = jax.jit(
        loss_and_grad,
        in_shardings=(param_shardings, rest_shardings, batch, batch),
        out_shardings=(NamedSharding(mesh, P()), param_shardings),
    )
    loss, grads = sharded_step(shard_model_state(params, mesh), shard_model_state(rest, mesh),
                               jax.device_put(tokens, batch), jax.device_put(targets, batch))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert grads["up"][...].sharding == NamedSharding(mesh, P("fsdp", "tensor"))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grads, expected_grads)
    assert parallel.data_parallel_size(mesh) == 4
    assert {s.data.shape for s in jax.device_put(tokens, batch).addressable_shards} == {(2, 5)}


def test_data_sharding_only_uses_axes_present():
    mesh = make_mesh({"tensor": 8})
    assert data_sharding(mesh) == NamedSharding(mesh, P(None))
    assert parallel.data_parallel_size(mesh) == 1
    assert parallel.replicated_sharding(mesh) == NamedSharding(mesh, P())


# --------------------------------------------------------------------------- distributed
_LAUNCHER_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                  "SLURM_NTASKS", "SLURM_NPROCS", "OMPI_COMM_WORLD_SIZE",
                  "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "JAX_LOCAL_DEVICE_IDS",
                  "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID",
                  "SLURM_NODEID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
                  "SLURM_TASKS_PER_NODE", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                  "HIP_VISIBLE_DEVICES")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    return calls


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"SLURM_NTASKS": "1"}, None),
        ({"SLURM_NTASKS": "4"}, "slurm"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "openmpi"),
        ({"TPU_WORKER_HOSTNAMES": "host0"}, None),
        ({"TPU_WORKER_HOSTNAMES": "host0,host1"}, "cloud_tpu"),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "coordinator"),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "1"}, None),
    ],
)
def test_multi_process_detection(clean_env, monkeypatch, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parallel.multi_process_environment() == expected
    assert parallel.initialize_distributed() is (expected is not None)
    assert len(clean_env) == (0 if expected is None else 1)


def test_a_tpu_vm_initialises_through_jax_detection(clean_env, monkeypatch):
    """On a TPU VM the slice's layout is in the metadata server: jax.distributed.initialize()
    is called without a layout (JAX reads it); off TPU, or with TPU_SKIP_MDS_QUERY, not."""
    from grpo_jax.parallel import mesh as mesh_lib

    assert mesh_lib.tpu_chips() == 0 or jax.default_backend() == "tpu"  # read from /sys
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    monkeypatch.setattr(mesh_lib, "tpu_chips", lambda: 4)
    assert parallel.multi_process_environment() == "cloud_tpu_vm"
    assert parallel.initialize_distributed()
    assert clean_env == [{"heartbeat_timeout_seconds": mesh_lib.HEARTBEAT_TIMEOUT_SECONDS}]
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    assert parallel.multi_process_environment() is None
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY")
    monkeypatch.setattr(mesh_lib, "tpu_chips", lambda: 0)
    assert parallel.multi_process_environment() is None


def test_initialize_distributed_passes_process_layout(clean_env, monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "2")
    assert parallel.initialize_distributed()
    assert clean_env == [{"num_processes": 4, "process_id": 2,
                          "heartbeat_timeout_seconds": parallel.mesh.HEARTBEAT_TIMEOUT_SECONDS}]


def test_explicit_flags_initialise_with_them_and_none_means_not_given(clean_env):
    # main passes every flag, None where absent: one process, nothing detected, no init.
    assert not parallel.initialize_distributed(coordinator_address=None, num_processes=None,
                                               process_id=None)
    assert clean_env == []
    assert parallel.initialize_distributed(coordinator_address="10.0.0.1:1234",
                                           num_processes=2, process_id=1)
    assert clean_env == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 2,
                          "process_id": 1,
                          "heartbeat_timeout_seconds": parallel.mesh.HEARTBEAT_TIMEOUT_SECONDS}]


def test_an_initialised_runtime_is_not_initialised_again(clean_env, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    assert not parallel.initialize_distributed()
    assert clean_env == []


_SLURM_TWO_NODES = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[001-002]",
                    "SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
                    "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}


@pytest.mark.parametrize("env, passed, gpus", [
    # One task per GPU, every task seeing the node's 4: JAX gives task 1 GPU 1.
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, [1]),
    ({}, None, [1]),  # no visible-device list: JAX's choice as well
    # --gpus-per-task=1: the task sees only its own GPU, as device 0.
    ({"CUDA_VISIBLE_DEVICES": "5"}, [0], [0]),
    # One task per node (SLURM_TASKS_PER_NODE) driving the 4 GPUs it sees.
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
      "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
     [0, 1, 2, 3], [0, 1, 2, 3]),
    # JAX_LOCAL_DEVICE_IDS is the user's word: left to JAX.
    ({"CUDA_VISIBLE_DEVICES": "5", "JAX_LOCAL_DEVICE_IDS": "0"}, None, [0]),
])
def test_a_slurm_task_initialises_with_its_own_gpus(clean_env, monkeypatch, env, passed, gpus):
    """SLURM's layout is left to JAX's detection (called here on what was passed): the
    coordinator is the first node, the process is SLURM_PROCID of SLURM_NTASKS, and the
    task drives the GPUs it should."""
    from jax._src import clusters

    for name, value in {**_SLURM_TWO_NODES, **env}.items():
        monkeypatch.setenv(name, value)
    assert parallel.multi_process_environment() == "slurm"
    assert parallel.initialize_distributed()
    (kwargs,) = clean_env
    assert kwargs.get("local_device_ids") == passed
    assert set(kwargs) <= {"local_device_ids", "heartbeat_timeout_seconds"}
    local = passed or (list(map(int, env["JAX_LOCAL_DEVICE_IDS"].split(",")))
                       if "JAX_LOCAL_DEVICE_IDS" in env else None)
    address, count, process, devices = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, local, "slurm", 300)
    assert address.startswith("node001:")
    assert (count, process) == (int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_PROCID"]))
    assert list(devices) == gpus


def test_real_transformer_sharded_forward_matches():
    models = pytest.importorskip("grpo_jax.models")
    config = models.named_config("tiny-1m", num_layers=1)
    mesh = _mesh()
    model = models.Transformer(config, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(2), (4, 6), 0, config.vocab_size)
    expected = model(tokens)
    graphdef, state = nnx.split(model)
    sharded = shard_model_state(state, mesh)
    specs = {jax.tree_util.keystr(path): leaf.sharding.spec
             for path, leaf in jax.tree_util.tree_leaves_with_path(sharded)}
    assert specs["['embedding'].value"] == P("tensor", "fsdp")
    assert specs["['blocks'][0]['mlp']['down_kernel'].value"] == P("tensor", "fsdp")
    assert specs["['blocks'][0]['attention']['o_kernel'].value"] == P("tensor", None, "fsdp")
    logits = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(
        sharded, jax.device_put(tokens, data_sharding(mesh)))
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_micro_batches_are_dealt_so_each_keeps_its_rows_on_every_device():
    """split_micro_batches deals units of G rows round-robin; over rows split on 8 devices in
    contiguous blocks, the micro-batch loop then needs no collective beyond the sum (a
    contiguous cut made XLA all-gather the batch), and the accumulated gradient equals the
    whole batch's."""
    from grpo_jax.training import accumulate_gradients, split_micro_batches

    rows = np.arange(16)
    dealt = np.asarray(split_micro_batches(rows, 2, row_unit=2))
    np.testing.assert_array_equal(dealt, [[0, 1, 4, 5, 8, 9, 12, 13],
                                          [2, 3, 6, 7, 10, 11, 14, 15]])
    with pytest.raises(ValueError, match="not divisible into 4 micro-batches of whole 2-row"):
        split_micro_batches(np.arange(12), 4, row_unit=2)

    mesh = parallel.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
    batch = jax.device_put(jax.random.normal(jax.random.key(0), (64, 16)),
                           parallel.data_sharding(mesh))
    weights = jnp.linspace(-1.0, 1.0, 16 * 4).reshape(16, 4)

    def loss_fn(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2) / 64.0, {}

    def step(w, x):
        return accumulate_gradients(loss_fn, w, x, 2, row_unit=4)[:2]

    text = jax.jit(step).lower(weights, batch).compile().as_text()
    assert "all-gather" not in text and "all-to-all" not in text
    loss, grads = jax.jit(step)(weights, batch)
    expected_loss, expected_grads = jax.value_and_grad(lambda w: loss_fn(w, batch)[0])(weights)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(grads, expected_grads, rtol=1e-5, atol=1e-6)
