"""Checkpoints: a thin wrapper over orbax-checkpoint's `CheckpointManager`.

One checkpoint = one step directory holding two items:

* ``state``: a pytree of arrays (params, optimizer state, reference params, PRNG keys, ...),
  saved with ``ocp.args.StandardSave`` and restored onto a target tree whose leaves may carry
  ``NamedSharding``s, so a restore lands directly on the mesh;
* ``meta``: a JSON-serialisable dict (stage name, step, data-iterator state, config hash),
  saved with ``ocp.args.JsonSave``.

The directory is a local path or a URL that stays one (`grpo_jax.storage`): ``gs://`` (orbax
writes through `etils.epath` and tensorstore's GCS driver; it has none for other object
stores) or ``file://`` (a local directory).

Saves are atomic: orbax writes into ``<step>.orbax-checkpoint-tmp-*`` and renames it to
``<step>`` when complete, so an interrupted save never replaces the latest good checkpoint;
unfinished temporary directories are ignored by `latest_step` and `restore`.

Integrity: every array's checksum is saved in the metadata and checked on restore, so a
checkpoint whose bytes changed on disk (a flipped bit that still decodes) is refused with
`CheckpointIntegrityError` instead of restored silently.

PRNG keys: both typed keys (``jax.random.key``) and raw ``uint32`` keys
(``jax.random.PRNGKey``) are supported. A typed key is stored as its ``key_data`` and its
implementation name is recorded in the metadata; `restore` wraps it back into a typed key
(with or without a target).

Typical use::

    ckpt = Checkpointer(workdir / "checkpoints", max_to_keep=3, save_interval_steps=50)
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(target=abstract_state)
    ...
    ckpt.save(step, state=state, meta={"stage": "rl", "step": step}, force=last_step)
    ckpt.close()
"""

from __future__ import annotations

import functools
import logging
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from grpo_jax import storage

__all__ = ["CheckpointIntegrityError", "CheckpointNotFoundError", "CheckpointSaveError",
           "Checkpointer", "checksums", "latest_meta"]

_STATE = "state"
_META = "meta"
# Reserved metadata field: {flattened key path: PRNG impl name} for typed keys in `state`.
_TYPED_KEYS_FIELD = "__typed_prng_keys__"
# Reserved metadata field: {flattened key path: checksum} of every array in `state`.
_CHECKSUMS_FIELD = "__checksums__"
_RESERVED = (_TYPED_KEYS_FIELD, _CHECKSUMS_FIELD)
# URL schemes orbax can write checkpoints to (file:// is a local directory).
URL_SCHEMES = ("gs", "file")


class CheckpointNotFoundError(FileNotFoundError):
    """Raised when a restore is asked for and no (matching) finished checkpoint exists."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, permissions, ...): one line."""


class CheckpointIntegrityError(ValueError):
    """A restored array does not match the checksum saved with it: one line."""


_WEIGHT = 2654435761  # odd: index i weighs (i * _WEIGHT) | 1, odd, mod 2**32


def _bits(x):
    """The elements' bit patterns as uint32 (bool as 0 / 1)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)


@functools.partial(jax.jit, static_argnums=(2,))
def _block_checksum(block, starts, strides):
    """sum_i u_i w_i mod 2**32 over one block of an array: u_i the bit pattern of the
    element at global flat index i, w_i = (i * _WEIGHT) | 1. `starts` are the block's offsets
    in the array and `strides` the array's row-major strides, so blocks of any sharding sum
    to the same value; one device, no collective."""
    index = jnp.zeros(block.shape, jnp.uint32)
    for d, (size, stride) in enumerate(zip(block.shape, strides)):
        along = (jnp.arange(size, dtype=jnp.uint32) + starts[d]) * jnp.uint32(stride)
        index = index + along.reshape([-1 if i == d else 1 for i in range(block.ndim)])
    weights = index * jnp.uint32(_WEIGHT) | jnp.uint32(1)
    return jnp.sum(_bits(block) * weights, dtype=jnp.uint32)


def _leaf_blocks(x) -> list:
    """The per-block checksums (device scalars) of the blocks of one array whose replica 0
    this process holds; their sum over every process, mod 2**32, is the array's checksum."""
    shape = tuple(np.shape(x))
    strides = tuple(int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape)))
    if isinstance(x, jax.Array):
        # Replica 0 of each distinct block: held by exactly one device of one process.
        blocks = [(shard.data, tuple(s.indices(n)[0] for s, n in zip(shard.index, shape)))
                  for shard in x.addressable_shards if shard.replica_id == 0]
    else:
        blocks = [(jnp.asarray(x), (0,) * len(shape))]
    return [_block_checksum(block, np.asarray(starts, np.uint32), strides)
            for block, starts in blocks]


def checksums(state: Any) -> dict[str, int]:
    """{flattened key path: checksum} of every array leaf of `state` (typed PRNG keys by
    their key data): a position-weighted sum of the array's bits mod 2**32, so any single
    flipped bit (and any swap of two different elements) changes it. Computed block by
    block on the devices that hold the array, without collectives (all dispatched, then
    fetched at once). With several processes each sums the blocks it holds and one small
    all-gather of those sums (every process must call this) gives every process the
    totals."""
    storable, _ = _to_storable(state)
    leaves = jax.tree_util.tree_flatten_with_path(storable)[0]
    values = jax.device_get([_leaf_blocks(x) for _, x in leaves])
    sums = np.asarray([sum(int(v) for v in blocks) % 2**32 for blocks in values], np.int64)
    if jax.process_count() > 1 and len(sums):
        from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

        gathered = multihost_utils.process_allgather(sums.astype(np.uint32)[None], tiled=True)
        sums = np.asarray(gathered).astype(np.int64).sum(0)  # uint32: jax has no int64 here
    return {_path_str(path): int(total % 2**32) for (path, _), total in zip(leaves, sums)}


def _save_error(step, directory, err) -> str:
    where = f"checkpoint {step}" if step is not None else "a checkpoint"
    root = err
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__  # orbax wraps the OSError it met
    reason = (str(root).splitlines() or [""])[0] or type(root).__name__
    return (f"saving {where} in {directory} failed ({type(root).__name__}: {reason[:300]}); "
            "the run stopped there (the last good checkpoint is kept)")


def _nbytes(storable) -> int:
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(storable))


class _QuietSaveFailures(logging.Filter):
    """Drops orbax's ERROR records and asyncio's (a failed save logs one per thread and
    file, hundreds of lines): every orbax failure reaches the Checkpointer's caller as an
    exception, which the Checkpointer reports in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and (
            "orbax" in record.pathname or record.name == "asyncio"))


_QUIET = _QuietSaveFailures()


def _is_typed_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _path_str(path) -> str:
    return jax.tree_util.keystr(path)


def _to_storable(state: Any) -> tuple[Any, dict[str, str]]:
    """Replaces typed PRNG keys by their uint32 key data; returns (tree, {path: impl})."""
    typed: dict[str, str] = {}

    def convert(path, x):
        if _is_typed_key(x):
            typed[_path_str(path)] = str(jax.random.key_impl(x))
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map_with_path(convert, state), typed


def _abstract_leaf(x: Any) -> Any:
    """Concrete or abstract array -> ShapeDtypeStruct keeping its sharding; others unchanged."""
    if _is_typed_key(x):
        data = jax.eval_shape(jax.random.key_data, x)
        sharding = getattr(x, "sharding", None)
        if sharding is not None and hasattr(sharding, "spec"):
            # key_data appends a trailing (replicated) dimension to the key's shape.
            sharding = jax.sharding.NamedSharding(sharding.mesh, sharding.spec)
        return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # numpy arrays / scalars
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def _wrap_typed_keys(tree: Any, typed: Mapping[str, str]) -> Any:
    if not typed:
        return tree

    def wrap(path, x):
        impl = typed.get(_path_str(path))
        if impl is None:
            return x
        return jax.random.wrap_key_data(jnp.asarray(x) if not isinstance(x, jax.Array) else x,
                                        impl=impl)

    return jax.tree_util.tree_map_with_path(wrap, tree)


def latest_meta(directory: str | os.PathLike) -> dict | None:
    """The metadata of the newest finished checkpoint under `directory` whose metadata
    reads, straight from its file (no manager, so any one process may call it); None when
    there is none. `directory` may be a URL (`grpo_jax.storage`)."""
    directory = os.fspath(directory)
    steps = sorted(int(name) for name in storage.listdir(directory) if name.isdigit())
    for step in reversed(steps):  # unfinished saves have temporary, non-numeric names
        try:
            meta = json.loads(storage.read_text(storage.join(directory, str(step), _META,
                                                             "metadata")))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict):
            for field in _RESERVED:
                meta.pop(field, None)
            return meta
    return None


class Checkpointer:
    """Saves and restores (state pytree, JSON metadata) pairs under one directory.

    A save records `checksums(state)` in the metadata and `restore` checks every restored
    array against it (in a multi-process run every process calls both, as orbax requires,
    and the checksums combine the processes' shards).

    Args:
      directory: where step sub-directories are written (created if missing): a local path,
        or a gs:// or file:// URL, which stays a URL (`self.directory`).
      max_to_keep: number of most recent checkpoints kept (None keeps all).
      save_interval_steps: when set, `save` only writes steps that are multiples of it
        (unless ``force=True``); None saves every call.
      async_: write in a background thread (`wait` blocks until writes are done).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int | None = None,
        async_: bool = True,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep: expected a positive int or None, got {max_to_keep}")
        if save_interval_steps is not None and save_interval_steps < 1:
            raise ValueError(
                f"save_interval_steps: expected a positive int or None, got {save_interval_steps}"
            )
        self.directory = storage.normalize(directory)
        if storage.is_url(self.directory) and storage.scheme(self.directory) not in URL_SCHEMES:
            raise ValueError(f"directory: expected a local path or a gs:// or file:// URL "
                             f"(orbax writes no other store), got {self.directory!r}")
        self.save_interval_steps = save_interval_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,  # interval handled here so `force` is explicit
            enable_async_checkpointing=async_,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            storage.path(self.directory), options=options, item_names=(_STATE, _META)
        )
        self._pending: tuple[int, int] | None = None  # (step, bytes) of an async save
        for logger in (logging.getLogger(), logging.getLogger("absl"),
                       logging.getLogger("asyncio")):
            if _QUIET not in logger.filters:
                logger.addFilter(_QUIET)

    # ------------------------------------------------------------------ queries
    def all_steps(self) -> list[int]:
        """Steps of the finished checkpoints, ascending."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The latest finished step, or None when the directory holds no checkpoint."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        """Whether `save(step)` without ``force`` writes (interval rule, step not yet saved)."""
        if step in self._manager.all_steps():
            return False
        return self.save_interval_steps is None or step % self.save_interval_steps == 0

    # ------------------------------------------------------------------ save
    def save(self, step: int, *, state: Any, meta: Mapping[str, Any] | None = None,
             force: bool = False) -> bool:
        """Writes checkpoint `step` (asynchronously unless ``async_=False``).

        Args:
          step: non-negative int, the step number (directory name).
          state: pytree of arrays; typed PRNG keys are allowed.
          meta: JSON-serialisable dict (stage, step, data iterator state, config hash, ...).
          force: write even if `step` is not a multiple of `save_interval_steps`.

        Returns:
          True when a checkpoint was started, False when skipped (interval rule, or `step`
          already saved, e.g. the end-of-stage save coinciding with a periodic one).
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step: expected a non-negative int, got {step!r}")
        meta = dict(meta or {})
        for field in _RESERVED:
            if field in meta:
                raise ValueError(f"meta: the field {field!r} is reserved")
        if step in self._manager.all_steps():
            return False
        if not force and not self.should_save(step):
            return False
        storable, typed = _to_storable(state)
        meta[_TYPED_KEYS_FIELD] = typed
        meta[_CHECKSUMS_FIELD] = checksums(storable)
        try:
            json.dumps(meta)
        except TypeError as err:
            raise ValueError(f"meta: expected a JSON-serialisable dict ({err})") from None
        self.check_errors()  # an earlier asynchronous save that failed stops here
        self._check_space(step, storable)
        try:
            saved = self._manager.save(
                step,
                args=ocp.args.Composite(
                    **{_STATE: ocp.args.StandardSave(storable), _META: ocp.args.JsonSave(meta)}
                ),
                force=True,
            )
        except Exception as err:  # noqa: BLE001
            # orbax first waits for the previous asynchronous save: its failure is that one's.
            failed = self._pending[0] if self._pending and self._previous_failed() else step
            raise CheckpointSaveError(_save_error(failed, self.directory, err)) from err
        if saved:
            self._pending = (step, _nbytes(storable))
        return bool(saved)

    def _previous_failed(self) -> bool:
        try:
            self._manager.check_for_errors()
        except Exception:  # noqa: BLE001
            return True
        return False

    def _check_space(self, step: int, storable) -> None:
        """CheckpointSaveError, before anything is written, when the disk cannot hold the
        checkpoint's arrays (uncompressed size, plus a save still in flight). Skipped on an
        object store (no free space to ask for)."""
        local = storage.local_path(self.directory)
        if local is None:
            return
        need = _nbytes(storable)
        if self._pending is not None and self._manager.is_saving_in_progress():
            need += self._pending[1]
        try:
            free = shutil.disk_usage(local).free
        except OSError:
            return
        if free < need:
            raise CheckpointSaveError(
                f"saving checkpoint {step} in {self.directory} needs up to "
                f"{need / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free; the run stopped "
                "there (the last good checkpoint is kept): free some space, then run the same "
                "command to resume")

    def check_errors(self) -> None:
        """Raises CheckpointSaveError naming the checkpoint whose asynchronous save failed
        (non-blocking)."""
        try:
            self._manager.check_for_errors()
        except Exception as err:  # noqa: BLE001
            failed = self._pending[0] if self._pending else None
            raise CheckpointSaveError(_save_error(failed, self.directory, err)) from err

    # ------------------------------------------------------------------ restore
    def _check_step(self, step: int | None) -> int:
        self.wait()
        steps = self.all_steps()
        if not steps:
            raise CheckpointNotFoundError(
                f"no finished checkpoint in {self.directory}: run training (which saves "
                "checkpoints) first, or point the workdir at an existing run"
            )
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointNotFoundError(
                f"step {step} not found in {self.directory}; available steps: {steps}"
            )
        return step

    def _restore_meta(self, step: int) -> dict:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()})
        )
        return dict(restored[_META])

    def restore_meta(self, step: int | None = None) -> dict:
        """Only the metadata dict of `step` (default: latest); reads no arrays."""
        meta = self._restore_meta(self._check_step(step))
        for field in _RESERVED:
            meta.pop(field, None)
        return meta

    def restore(self, step: int | None = None, *, target: Any = None) -> tuple[Any, dict]:
        """Restores (state, meta) of `step` (default: the latest finished step).

        Args:
          step: which step to restore; None means `latest_step()`.
          target: optional pytree with the structure of the saved state whose leaves are
            arrays or `jax.ShapeDtypeStruct`s; their shapes, dtypes and shardings (e.g.
            ``NamedSharding`` on a mesh) decide how arrays are restored. Typed PRNG key
            leaves (concrete or abstract) restore as typed keys. Without a target, arrays
            come back in the saved structure (dicts/lists) on the default device.

        Returns:
          (state, meta): the restored pytree and the metadata dict.

        Raises:
          CheckpointIntegrityError: an array differs from what was saved (its checksum).
        """
        step = self._check_step(step)
        meta = self._restore_meta(step)
        typed = meta.pop(_TYPED_KEYS_FIELD, {}) or {}
        saved_sums = meta.pop(_CHECKSUMS_FIELD, None)
        if target is None:
            state_args = ocp.args.StandardRestore()
        else:
            abstract = jax.tree.map(_abstract_leaf, target)
            state_args = ocp.args.StandardRestore(abstract)
        try:
            state = self._manager.restore(
                step, args=ocp.args.Composite(**{_STATE: state_args})
            )[_STATE]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"target: does not match the state saved at step {step} in "
                f"{self.directory} ({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from err
        if saved_sums is not None:  # checkpoints written before checksums have none
            # Every restored array (a target may ask for part of the state) against its sum.
            for path, value in checksums(state).items():
                if path in saved_sums and saved_sums[path] != value:
                    raise CheckpointIntegrityError(
                        f"checkpoint {step} in {self.directory}: array {path} does not match "
                        f"the checksum saved with it ({value} != {saved_sums[path]}); its "
                        "files changed after the save")
        return _wrap_typed_keys(state, typed), meta

    # ------------------------------------------------------------------ removal
    def delete(self, step: int) -> None:
        """Deletes checkpoint `step`."""
        self.wait()
        self._manager.delete(step)
        self._manager.reload()

    def quarantine(self, step: int) -> str:
        """Moves checkpoint `step` out of the managed directory (into `<directory>_corrupt/`),
        so restores and saves no longer see it; returns where it went."""
        self.wait()
        source = storage.join(self.directory, str(step))
        target_dir = self.directory + "_corrupt"
        storage.makedirs(target_dir)
        target = storage.join(target_dir, str(step))
        suffix = 0
        while storage.exists(target):
            suffix += 1
            target = storage.join(target_dir, f"{step}.{suffix}")
        storage.move_tree(source, target)
        self._manager.reload()
        return target

    # ------------------------------------------------------------------ lifecycle
    def wait(self) -> None:
        """Blocks until all pending asynchronous saves are finished (CheckpointSaveError if
        one failed)."""
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001
            failed = self._pending[0] if self._pending else None
            raise CheckpointSaveError(_save_error(failed, self.directory, err)) from err

    def close(self) -> None:
        """Waits for pending saves and releases the manager's resources."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
