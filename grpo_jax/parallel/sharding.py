"""Logical axis rules: from the names parameters carry to mesh `PartitionSpec`s.

Parameters of `grpo_jax.models` carry logical axis names in their ``out_sharding`` metadata
(e.g. the embedding is ``("vocab", "embed")``). A rule table, a tuple of
``(logical_name, mesh_axes)`` pairs in priority order (the format of flax's
``nnx.logical_axis_rules``), maps them to mesh axes, where ``mesh_axes`` is a mesh axis
name, a tuple of them, or None (replicated).

Mapping of one array's names (`logical_to_mesh_spec`):

* a name without a rule maps to None (replicated) instead of failing, unless it is itself
  a mesh axis name (then it maps to that axis, as in flax);
* several rules for one name are tried in order; a rule is skipped when its mesh axes are
  already used by an earlier dimension of the same array (an axis can shard one dimension
  only);
* given the mesh and the array shape, mesh axes absent from the mesh are dropped, and so
  are axes that would not divide the dimension evenly (e.g. 2 kv heads over tensor=4), so
  any model fits any mesh: what cannot be split is replicated.

Activations carry logical names too (("batch", "length", None) for the residual stream,
("batch", "length", "vocab") for logits). A module with an ``activation_sharding``
attribute (`grpo_jax.models.Transformer`) placed on a mesh of several devices by
`shard_model_state`, `abstract_sharded_state` or `sharded_init` gets an
`ActivationSharding` and constrains them with the same rules: under FSDP the rows stay
split over data x fsdp and each layer's weights are gathered, instead of the weights
staying in place and the activations (and the logits) being all-reduced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "ActivationSharding",
    "DEFAULT_RULES",
    "abstract_sharded_state",
    "logical_to_mesh_spec",
    "rollout_rules",
    "shard_model_state",
    "sharded_init",
    "state_shardings",
    "validate_rules",
    "variable_logical_names",
]

MeshAxes = None | str | tuple[str, ...]
Rules = Sequence[tuple[str, MeshAxes]]

# Logical names used by grpo_jax.models (see its module docstring) and by activations.
DEFAULT_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("batch", ("data", "fsdp")),  # activations / data: batch split over all data axes
    ("length", None),             # sequence positions
    ("vocab", "tensor"),
    ("embed", "fsdp"),            # FSDP: parameters split along the model dimension
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),             # stacked / scanned layers
    ("norm", None),
)


# Mesh axes over which batch rows are split (`grpo_jax.parallel.data_sharding`).
_BATCH_AXES = ("data", "fsdp")


def rollout_rules(rules: Rules = DEFAULT_RULES) -> tuple[tuple[str, MeshAxes], ...]:
    """The rules of the sampler's rollout copy of the parameters: `rules` with the batch
    axes (data, fsdp) removed from every name but "batch".

    Parameters are then whole on every device of a data x fsdp group (still split over
    tensor where the rules say so), and the decode loop, whose rows stay split over data x
    fsdp, needs no collective but tensor-parallel ones: FSDP's per-layer weight gathers
    would otherwise run at every decode step (or GSPMD would all-reduce the activations).
    """
    out = []
    for name, axes in validate_rules(rules):
        if name != "batch":
            kept = tuple(a for a in _candidate_axes(axes) if a not in _BATCH_AXES)
            axes = None if not kept else kept[0] if len(kept) == 1 else kept
        out.append((name, axes))
    return tuple(out)


def validate_rules(rules: Rules) -> tuple[tuple[str, MeshAxes], ...]:
    """Checks the rule table format; returns it as a tuple of (name, mesh axes) pairs."""
    checked = []
    for index, rule in enumerate(rules):
        ok = isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
        if ok:
            name, axes = rule
            if isinstance(axes, list):
                axes = tuple(axes)
            ok = axes is None or isinstance(axes, str) or (
                isinstance(axes, tuple) and all(isinstance(a, str) for a in axes)
            )
        if not ok:
            raise ValueError(
                f"rules[{index}]: expected (logical_name, mesh_axis | tuple of mesh axes | "
                f"None), got {rule!r}"
            )
        checked.append((name, axes))
    return tuple(checked)


def _candidate_axes(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh_spec(
    names: Sequence[str | None] | None,
    rules: Rules = DEFAULT_RULES,
    *,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """Maps one array's logical axis names to a `PartitionSpec` of mesh axes.

    Args:
      names: one logical name (or None) per array dimension; None/() gives ``P()``.
      rules: (logical_name, mesh axes) pairs in priority order.
      mesh: when given, mesh axes not in it are dropped and names equal to one of its axes
        map to that axis.
      shape: the array shape (needs `mesh`): axes that do not divide a dimension are dropped.

    Returns:
      PartitionSpec with one entry (None, an axis name or a tuple of names) per dimension.
    """
    if not names:
        return PartitionSpec()
    rules = validate_rules(rules)
    if shape is not None and len(shape) != len(names):
        raise ValueError(
            f"names: expected one logical name per dimension of shape {tuple(shape)}, "
            f"got {tuple(names)}"
        )
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        candidates = [axes for rule_name, axes in rules if rule_name == name]
        if not candidates and mesh is not None and name in mesh.axis_names:
            candidates = [name]
        chosen: tuple[str, ...] = ()
        for axes in candidates:
            axes = _candidate_axes(axes)
            if any(axis in used for axis in axes):
                continue  # each mesh axis can shard only one dimension
            if mesh is not None:
                axes = tuple(axis for axis in axes if axis in mesh.axis_names)
                if shape is not None:
                    kept, product = [], 1
                    for axis in axes:
                        if shape[dim] % (product * mesh.shape[axis]) == 0:
                            kept.append(axis)
                            product *= mesh.shape[axis]
                    axes = tuple(kept)
            if axes:
                chosen = axes
                break
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
    return PartitionSpec(*spec)


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
    """The mesh and rules by which a model constrains its activations (hashable: it is a
    static attribute of a sharded `Transformer`).

    `constrain(x, names)` is `jax.lax.with_sharding_constraint` to the logical names
    resolved by the rules (e.g. ("batch", "length", None): rows over data x fsdp, as
    `data_sharding` places batches), and the identity where nothing would be split.
    """

    mesh: Mesh
    rules: tuple = DEFAULT_RULES

    def constrain(self, x: jax.Array, names: Sequence[str | None]) -> jax.Array:
        spec = logical_to_mesh_spec(names, self.rules, mesh=self.mesh, shape=x.shape)
        if all(entry is None for entry in spec):
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def splits(self, x: jax.Array, names: Sequence[str | None]) -> bool:
        """Whether the logical `names` split any dimension of x over more than one device."""
        spec = logical_to_mesh_spec(names, self.rules, mesh=self.mesh, shape=x.shape)
        return any(n > 1 for n in mesh_axis_sizes(spec, self.mesh))

    def map_rows(self, fn: Callable, rows: tuple, shared: tuple) -> Any | None:
        """fn(*rows, *shared) run by each device on its own rows (`jax.shard_map`): `rows`
        are arrays [B, ...] split over the batch axes, `shared` are whole on every device,
        and so are the outputs' rows. A gradient with respect to `shared` is summed over
        the devices once, after fn (under GSPMD a loop inside fn would all-reduce it at
        every iteration). None when B does not split over the batch axes (the caller then
        runs fn as it is)."""
        b = rows[0].shape[0]
        axes = logical_to_mesh_spec(("batch",), self.rules, mesh=self.mesh, shape=(b,))[0]
        if axes is None:
            return None
        spec = PartitionSpec(axes)
        names = (axes,) if isinstance(axes, str) else tuple(axes)

        def local(*args):
            # Marked as varying over the batch axes on entry, so that the transpose (the
            # sum of `shared`'s gradient over the devices) happens here, once, rather than
            # wherever fn first combines it with the rows (inside a loop: every iteration).
            mine, whole = args[:len(rows)], args[len(rows):]
            return fn(*mine, *(jax.lax.pcast(x, names, to="varying") for x in whole))

        in_specs = (spec,) * len(rows) + (PartitionSpec(),) * len(shared)
        return jax.shard_map(local, mesh=self.mesh, in_specs=in_specs, out_specs=spec)(
            *rows, *shared)

    def rollout_state(self, state: Any) -> Any:
        """The sampler's copy of a model state (`rollout_rules`), inside a jitted program:
        every array constrained whole over data x fsdp (still split over tensor where the
        rules say so), so the one gather happens before the decode loop."""
        shardings = state_shardings(state, self.mesh, rollout_rules(self.rules))

        def place(x, sharding):
            if not isinstance(sharding, (nnx.Variable, NamedSharding)):
                return x
            target = sharding.get_value() if _is_variable(sharding) else sharding
            value = x.get_value() if _is_variable(x) else x
            value = jax.lax.with_sharding_constraint(value, target)
            return x.replace(value) if _is_variable(x) else value

        return jax.tree.map(place, state, shardings, is_leaf=_is_variable)


def variable_logical_names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names an nnx Variable carries (its ``out_sharding`` metadata)."""
    names = variable.get_metadata().get("out_sharding")
    if names is None:
        return None
    if isinstance(names, NamedSharding):
        names = names.spec
    return tuple(names)


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedShardings for every array of an nnx state (concrete or abstract).

    Args:
      state: `nnx.State` (or any pytree) whose leaves are nnx Variables with logical names,
        plain arrays, or `jax.ShapeDtypeStruct`s.
      mesh: the device mesh.
      rules: logical rules (unknown names replicate).

    Returns:
      a tree with the structure of `state` (Variables keep their metadata) whose array
      leaves are replaced by `NamedSharding`s; usable as jit in/out shardings.
    """
    rules = validate_rules(rules)

    def leaf_sharding(x):
        if _is_variable(x):
            value = x.get_value()
            if not hasattr(value, "shape"):
                return x
            spec = logical_to_mesh_spec(variable_logical_names(x), rules, mesh=mesh,
                                        shape=value.shape)
            return x.replace(NamedSharding(mesh, spec))
        if hasattr(x, "shape"):
            return NamedSharding(mesh, PartitionSpec())
        return x

    return jax.tree.map(leaf_sharding, state, is_leaf=_is_variable)


def _set_activation_sharding(module: nnx.Module, mesh: Mesh, rules: Rules) -> None:
    """Gives a model that constrains its activations (an `activation_sharding` attribute,
    as `grpo_jax.models.Transformer` has) the mesh and rules; on one device, nothing."""
    if hasattr(module, "activation_sharding"):
        module.activation_sharding = (
            ActivationSharding(mesh, validate_rules(rules)) if mesh.size > 1 else None)


def shard_model_state(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Places every array of an nnx state (or of a module, updated in place) on the mesh.

    Args:
      state: `nnx.State` / pytree of Variables and arrays, or an `nnx.Module`.
      mesh: the device mesh.
      rules: logical rules (see `logical_to_mesh_spec`).

    Returns:
      the state with each array `device_put` on its NamedSharding (the module itself when a
      module was given).
    """
    if isinstance(state, nnx.Module):
        module = state
        nnx.update(module, shard_model_state(nnx.state(module), mesh, rules))
        _set_activation_sharding(module, mesh, rules)
        return module
    shardings = state_shardings(state, mesh, rules)
    values, treedef = jax.tree.flatten(state)
    targets = treedef.flatten_up_to(shardings)
    placed = [jax.device_put(v, s) if isinstance(s, NamedSharding) else v
              for v, s in zip(values, targets)]
    return treedef.unflatten(placed)


def abstract_sharded_state(
    model_factory: Callable[[], nnx.Module], mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, state of ShapeDtypeStructs carrying shardings) without allocating params.

    The abstract state is a restore target for `grpo_jax.checkpoint.Checkpointer.restore`.
    """
    abstract_model = nnx.eval_shape(model_factory)
    _set_activation_sharding(abstract_model, mesh, rules)
    graphdef, abstract_state = nnx.split(abstract_model)
    shardings = state_shardings(abstract_state, mesh, rules)
    values, treedef = jax.tree.flatten(abstract_state)
    targets = treedef.flatten_up_to(shardings)
    with_sharding = [
        jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s) if isinstance(s, NamedSharding) else v
        for v, s in zip(values, targets)
    ]
    return graphdef, treedef.unflatten(with_sharding)


def sharded_init(
    model_factory: Callable[[], nnx.Module], mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> tuple[nnx.GraphDef, Any]:
    """Initialises a model directly on the mesh (each device builds only its shards).

    Args:
      model_factory: zero-argument function building the module, e.g.
        ``lambda: Transformer(config, rngs=nnx.Rngs(0))``.

    Returns:
      (graphdef, state) with every array on its rule-given NamedSharding; the values equal
      those of an unsharded ``nnx.split(model_factory())`` (same random bits; jit may
      round the initialiser's arithmetic differently by an ulp).
    """
    abstract_model = nnx.eval_shape(model_factory)
    _set_activation_sharding(abstract_model, mesh, rules)
    graphdef, abstract_state = nnx.split(abstract_model)
    shardings = state_shardings(abstract_state, mesh, rules)
    state = jax.jit(lambda: nnx.split(model_factory())[1], out_shardings=shardings)()
    return graphdef, state


def mesh_axis_sizes(spec: PartitionSpec, mesh: Mesh) -> tuple[int, ...]:
    """Number of shards of each dimension under `spec` (1 for replicated dimensions)."""
    return tuple(
        math.prod(mesh.shape[a] for a in _candidate_axes(entry)) for entry in spec
    )
