"""Device mesh, batch sharding and multi-process start-up.

Mesh axes are ``data`` (pure data parallelism), ``fsdp`` (data parallelism with parameters
sharded along their ``embed`` dimension) and ``tensor`` (model parallelism over heads,
MLP hidden units and vocabulary). Batches are split over ``("data", "fsdp")``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from grpo_jax.parallel.multihost import _merged, row_layout_problem

__all__ = [
    "BATCH_AXES",
    "DEFAULT_MESH_SHAPE",
    "batch_row_layout",
    "data_parallel_size",
    "data_sharding",
    "initialize_distributed",
    "make_mesh",
    "multi_process_environment",
    "order_by_process",
    "replicated_sharding",
    "slurm_local_device_ids",
]

DEFAULT_MESH_SHAPE = {"data": -1, "fsdp": 1, "tensor": 1}
BATCH_AXES = ("data", "fsdp")

_AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _as_dict(shape: Any) -> dict[str, Any]:
    if shape is None:
        return dict(DEFAULT_MESH_SHAPE)
    if hasattr(shape, "items"):  # dict, ml_collections.ConfigDict, FrozenConfigDict
        return {str(k): v for k, v in shape.items()}
    raise ValueError(
        f"mesh: expected a mapping axis name -> size such as {DEFAULT_MESH_SHAPE}, got {shape!r}"
    )


def resolve_mesh_shape(shape: Mapping[str, int] | None, num_devices: int) -> dict[str, int]:
    """Replaces the single -1 entry by the remaining device count and checks the product.

    Args:
      shape: axis name -> size; at most one size may be -1 ("all remaining devices").
      num_devices: number of devices the mesh spans.

    Returns:
      dict axis name -> positive size whose product is `num_devices`.
    """
    sizes = _as_dict(shape)
    if not sizes:
        raise ValueError("mesh: expected at least one axis")
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
            raise ValueError(f"mesh.{name}: expected a positive int or -1, got {size!r}")
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {free}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if num_devices % fixed:
            raise ValueError(
                f"mesh: the fixed axis sizes multiply to {fixed}, which does not divide the "
                f"{num_devices} devices"
            )
        sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(
            f"mesh: axis sizes {sizes} multiply to {fixed}, expected the device count "
            f"{num_devices} (use -1 for one axis to take the remaining devices)"
        )
    return sizes


def make_mesh(
    shape: Mapping[str, int] | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
    axis_types: str = "auto",
) -> Mesh:
    """Builds a device mesh with `jax.make_mesh` from {axis name: size}.

    With devices of several processes, batch rows (`data_sharding`) must lie on the
    processes in one contiguous block each, block p on process p (`multihost.process_rows`).
    `jax.make_mesh` orders devices by their physical topology, which on some TPU slices
    interleaves the processes (as can a `devices` list in another order); the mesh then
    takes the devices process by process instead, each process's own in the order jax gave
    them (`order_by_process`).

    Args:
      shape: axis name -> size, e.g. ``{"data": -1, "fsdp": 1, "tensor": 1}`` (the default)
        or a config section such as ``config.mesh``; one size may be -1.
      devices: devices to use (default: all of `jax.devices()`).
      axis_types: "auto" (default: GSPMD propagates shardings from the jit in/out shardings
        and parameter layouts, which is what the logical-axis rules assume) or "explicit"
        (sharding in types; jax 0.10's own default for `jax.make_mesh`).

    Returns:
      a `jax.sharding.Mesh` with the axes in the order given.
    """
    if axis_types not in _AXIS_TYPES:
        raise ValueError(f"axis_types: expected one of {sorted(_AXIS_TYPES)}, got {axis_types!r}")
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(shape, len(devices))
    mesh = jax.make_mesh(
        tuple(sizes.values()),
        tuple(sizes.keys()),
        axis_types=(_AXIS_TYPES[axis_types],) * len(sizes),
        devices=devices,
    )
    given = mesh.devices
    grid = order_by_process(given, mesh.axis_names)
    return mesh if grid is given else Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types)


def batch_row_layout(grid: np.ndarray, axis_names: Sequence[str],
                     axes: Sequence[str] = BATCH_AXES) -> dict[int, list[tuple[int, int]]]:
    """`multihost.process_row_layout` of `data_sharding` on a mesh with device grid `grid`,
    in units of batch shards (one row per shard): {process: [start, stop) spans}. Rows
    split over the batch axes present, the first of `axes` major."""
    names = list(axis_names)
    position = np.zeros(grid.shape, np.int64)
    for axis in _present(names, axes):
        dim = names.index(axis)
        index = np.arange(grid.shape[dim]).reshape([-1 if d == dim else 1
                                                    for d in range(grid.ndim)])
        position = position * grid.shape[dim] + index
    held: dict[int, set] = {}
    for device, shard in zip(grid.flat, position.flat):
        held.setdefault(int(device.process_index), set()).add(int(shard))
    return {process: _merged((shard, shard + 1) for shard in shards)
            for process, shards in sorted(held.items())}


def order_by_process(grid: np.ndarray, axis_names: Sequence[str]) -> np.ndarray:
    """A mesh's device grid as it is when the batch rows lie on the processes in one
    contiguous block each in process order (always with one process); else the same devices
    taken process by process (a stable sort: each process's devices keep their order) when
    that lays the rows out so; else as it is (no order can: the tensor axis spans processes,
    or the batch axes do not lead the mesh), for `process_rows` to name the layout."""
    processes = {int(d.process_index) for d in grid.flat}
    if len(processes) == 1:
        return grid
    shards = math.prod(grid.shape[list(axis_names).index(a)]
                       for a in _present(list(axis_names), BATCH_AXES))
    if not row_layout_problem(batch_row_layout(grid, axis_names), shards, len(processes)):
        return grid
    flat = list(grid.flat)
    ordered = sorted(range(len(flat)), key=lambda i: (int(flat[i].process_index), i))
    candidate = np.asarray([flat[i] for i in ordered], dtype=object).reshape(grid.shape)
    if row_layout_problem(batch_row_layout(candidate, axis_names), shards, len(processes)):
        return grid
    return candidate


def _present(names: Sequence[str], axes: Sequence[str]) -> list[str]:
    return [axis for axis in axes if axis in names]


def _batch_axes(mesh: Mesh, axes: Sequence[str]) -> tuple[str, ...]:
    return tuple(_present(mesh.axis_names, axes))


def data_parallel_size(mesh: Mesh, axes: Sequence[str] = BATCH_AXES) -> int:
    """Number of batch shards: the product of the mesh sizes of the batch axes present."""
    return math.prod(mesh.shape[axis] for axis in _batch_axes(mesh, axes))


def data_sharding(mesh: Mesh, axes: Sequence[str] = BATCH_AXES) -> NamedSharding:
    """Sharding for batch arrays [B, ...]: B split over ("data", "fsdp"), the rest replicated.

    The batch size must be divisible by `data_parallel_size(mesh)`.
    """
    present = _batch_axes(mesh, axes)
    return NamedSharding(mesh, PartitionSpec(present if present else None))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding that keeps a full copy of an array on every device of `mesh`."""
    return NamedSharding(mesh, PartitionSpec())


def _int_env(name: str) -> int:
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


def multi_process_environment() -> str | None:
    """Names the detected multi-process launcher, or None for a single-process run.

    Detected: an explicit coordinator (``JAX_COORDINATOR_ADDRESS``, with
    ``JAX_NUM_PROCESSES`` > 1 when given), SLURM (``SLURM_NTASKS`` > 1), Open MPI
    (``OMPI_COMM_WORLD_SIZE`` > 1), multi-host Cloud TPU (``TPU_WORKER_HOSTNAMES`` listing
    several hosts, or ``MEGASCALE_COORDINATOR_ADDRESS``), and a Cloud TPU VM (TPU chips on the
    PCI bus: a pod slice's hosts find each other through the metadata server, which
    `jax.distributed.initialize()` reads; ``TPU_SKIP_MDS_QUERY`` turns this off).
    """
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        if "JAX_NUM_PROCESSES" not in os.environ or _int_env("JAX_NUM_PROCESSES") > 1:
            return "coordinator"
    if _int_env("SLURM_NTASKS") > 1 or _int_env("SLURM_NPROCS") > 1:
        return "slurm"
    if _int_env("OMPI_COMM_WORLD_SIZE") > 1:
        return "openmpi"
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1 or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "cloud_tpu"
    if tpu_chips() and not os.environ.get("TPU_SKIP_MDS_QUERY"):
        # A TPU VM: the slice's layout is in the metadata server, not the environment, and
        # JAX's own detection reads it (a single-host VM initialises as 1 process).
        return "cloud_tpu_vm"
    return None


def tpu_chips() -> int:
    """TPU chips on this host's PCI bus (0 off TPU); reads /sys, starts no backend."""
    try:
        from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel

        return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
    except Exception:  # noqa: BLE001  (a private module: absent or changed)
        return 0


HEARTBEAT_TIMEOUT_SECONDS = 30
# The variables through which a launcher (SLURM's GPU binding) says which GPUs a process sees.
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _tasks_on_this_node() -> int | None:
    """SLURM's task count on this node (SLURM_NTASKS_PER_NODE, else this node's entry of
    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE such as "2(x3),1"); None if unknown."""
    if _int_env("SLURM_NTASKS_PER_NODE") > 0:
        return _int_env("SLURM_NTASKS_PER_NODE")
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return None
    counts: list[int] = []
    try:
        for part in spec.split(","):
            count, _, repeat = part.partition("(x")
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    except ValueError:
        return None
    node = _int_env("SLURM_NODEID")
    return counts[node] if node < len(counts) else None


def slurm_local_device_ids() -> list[int] | None:
    """Under SLURM, the GPUs this task should drive where JAX's own choice would be wrong;
    None leaves the choice to JAX.

    JAX gives task i of a node the i-th GPU it sees (SLURM_LOCALID): right when one task per
    GPU runs and every task sees every GPU of the node. When SLURM binds GPUs to tasks
    (--gpus-per-task, --gpu-bind) a task sees only its own, numbered from 0 (there is no
    i-th), and a task alone on its node should drive every GPU it sees: then these are all
    the GPUs the task sees (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES
    lists them). Without such a list nothing says how many a task sees: JAX decides.
    """
    visible = next((os.environ[name] for name in VISIBLE_DEVICE_VARS
                    if os.environ.get(name, "").strip()), None)
    if visible is None or "SLURM_LOCALID" not in os.environ:
        return None
    count = len([entry for entry in visible.split(",") if entry.strip()])
    tasks = _tasks_on_this_node()
    if count <= _int_env("SLURM_LOCALID") or tasks == 1 or (tasks is not None and count < tasks):
        return list(range(count))
    return None


def initialize_distributed(**kwargs: Any) -> bool:
    """Calls `jax.distributed.initialize(**kwargs)` when a multi-process launch is detected.

    Also calls it when explicit `kwargs` (coordinator_address, num_processes, process_id)
    are given. Must run before any other JAX call that touches devices. A no-op for single-process
    runs and when JAX's distributed runtime is already initialised. The process layout comes
    from the kwargs, else from JAX_NUM_PROCESSES / JAX_PROCESS_ID with JAX_COORDINATOR_ADDRESS,
    else from JAX's own detection (SLURM, Open MPI, Cloud TPU); under SLURM a task's GPUs are
    set where JAX's choice would be wrong (`slurm_local_device_ids`).

    Returns:
      True when `jax.distributed.initialize` was called.
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    environment = multi_process_environment()
    if environment is None and not kwargs:
        return False
    if jax.distributed.is_initialized():
        return False
    if environment == "coordinator" and "JAX_NUM_PROCESSES" in os.environ:
        kwargs.setdefault("num_processes", _int_env("JAX_NUM_PROCESSES"))
        if "JAX_PROCESS_ID" in os.environ:
            kwargs.setdefault("process_id", _int_env("JAX_PROCESS_ID"))
    if environment == "slurm" and "local_device_ids" not in kwargs \
            and not os.environ.get("JAX_LOCAL_DEVICE_IDS"):
        local_device_ids = slurm_local_device_ids()
        if local_device_ids is not None:
            kwargs["local_device_ids"] = local_device_ids
    # CPU devices of several processes talk through gloo (the default CPU client has no
    # cross-process collectives); GPU and TPU clients ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A process that stops answering (its host gone) ends the others after this long
    # rather than JAX's default 100 s; heartbeats come from a thread of their own, so long
    # compilations do not miss them.
    kwargs.setdefault("heartbeat_timeout_seconds", HEARTBEAT_TIMEOUT_SECONDS)
    jax.distributed.initialize(**kwargs)
    return True
