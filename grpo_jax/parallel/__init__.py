"""Mesh, logical axis rules, sharding helpers and multi-process start-up.

    mesh = make_mesh(config.mesh)                 # {"data": -1, "fsdp": 1, "tensor": 1}
    model = shard_model_state(model, mesh, DEFAULT_RULES)      # or sharded_init(...)
    batch = jax.device_put(batch, data_sharding(mesh))         # batch dim over data x fsdp
"""

from grpo_jax.parallel.mesh import (
    BATCH_AXES,
    DEFAULT_MESH_SHAPE,
    data_parallel_size,
    data_sharding,
    initialize_distributed,
    make_mesh,
    multi_process_environment,
    order_by_process,
    replicated_sharding,
    resolve_mesh_shape,
)
from grpo_jax.parallel.multihost import (
    allgather_rows,
    allgather_strings,
    is_primary,
    local_rows,
    lost_peer,
    process_row_layout,
    process_rows,
    sync,
    to_global,
)
from grpo_jax.parallel.sharding import (
    DEFAULT_RULES,
    ActivationSharding,
    abstract_sharded_state,
    logical_to_mesh_spec,
    mesh_axis_sizes,
    rollout_rules,
    shard_model_state,
    sharded_init,
    state_shardings,
    validate_rules,
    variable_logical_names,
)

# Name used in ARCHITECTURE.md.
shard_params = shard_model_state

__all__ = [
    "ActivationSharding",
    "allgather_rows",
    "allgather_strings",
    "is_primary",
    "local_rows",
    "lost_peer",
    "process_row_layout",
    "process_rows",
    "sync",
    "to_global",
    "BATCH_AXES",
    "DEFAULT_MESH_SHAPE",
    "DEFAULT_RULES",
    "abstract_sharded_state",
    "data_parallel_size",
    "data_sharding",
    "initialize_distributed",
    "logical_to_mesh_spec",
    "make_mesh",
    "mesh_axis_sizes",
    "multi_process_environment",
    "order_by_process",
    "replicated_sharding",
    "resolve_mesh_shape",
    "rollout_rules",
    "shard_model_state",
    "shard_params",
    "sharded_init",
    "state_shardings",
    "validate_rules",
    "variable_logical_names",
]
