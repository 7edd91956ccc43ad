"""Multi-controller helpers: which rows of a batch this process holds, host data <-> global
arrays, and gathers of host results.

In a multi-controller run every process runs the same program over one global mesh. A batch
sharded over the data axes puts a contiguous block of rows on each process's devices (the
mesh orders devices by process); `process_rows` says which. A process encodes only its
block, `to_global` assembles the global array from every process's block
(`jax.make_array_from_process_local_data`), `local_rows` reads this process's block of a
global array back to the host, and `allgather_rows` / `allgather_strings` give every
process the whole batch of small host results (rewards, lengths, texts). With one process
all of these are plain copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

__all__ = ["allgather_rows", "allgather_strings", "is_primary", "local_rows", "lost_peer",
           "process_rows", "sync", "to_global"]

# What XLA's CPU (Gloo), GPU (NCCL) and TPU runtimes and JAX's coordination service say when
# another process of the run has died or stopped answering.
_LOST_PEER = ("Gloo", "Connection reset by peer", "Connection closed by peer", "NCCL",
              "heartbeat", "coordination service", "DEADLINE_EXCEEDED", "UNAVAILABLE")


def is_primary() -> bool:
    """Whether this process writes files (metrics, reports, config.json): process 0."""
    return jax.process_index() == 0


def lost_peer(err: BaseException) -> str | None:
    """In a multi-process run, the first line of `err` (or of an exception it came from)
    when it says that another process died or stopped answering; else None."""
    if jax.process_count() == 1:
        return None
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        if any(marker in text for marker in _LOST_PEER):
            line = next((ln.strip() for ln in text.splitlines() if
                         any(marker in ln for marker in _LOST_PEER)), text.splitlines()[0])
            return f"{type(err).__name__}: {line[:300]}"
        err = err.__cause__ or err.__context__
    return None


def sync(name: str) -> None:
    """A barrier across processes (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def process_rows(sharding, rows: int) -> tuple[int, int]:
    """[start, stop) of the rows of a [rows, ...] batch under `sharding` on this process.

    Raises:
      ValueError: the rows do not split into equal contiguous blocks in process order.
    """
    count, index = jax.process_count(), jax.process_index()
    if rows % count:
        raise ValueError(f"a batch of {rows} rows does not split over {count} processes")
    slices = sharding.addressable_devices_indices_map((rows,)).values()
    spans = sorted({(s[0].start or 0, rows if s[0].stop is None else s[0].stop)
                    for s in slices})
    start, stop = spans[0][0], spans[-1][1]
    covered = sum(b - a for a, b in spans)
    per = rows // count
    if covered != stop - start or (start, stop) != (index * per, (index + 1) * per):
        raise ValueError(
            f"process {index}: its devices hold rows {spans} of {rows}, not the contiguous "
            f"block [{index * per}, {(index + 1) * per}) in process order; build the mesh "
            "from jax.devices() in their order")
    return start, stop


def to_global(local: np.ndarray, sharding, rows: int) -> jax.Array:
    """The global [rows, ...] array whose block on this process is `local`."""
    local = np.asarray(local)
    return jax.make_array_from_process_local_data(sharding, local, (rows, *local.shape[1:]))


def local_rows(array: jax.Array) -> np.ndarray:
    """This process's contiguous block of rows of a row-sharded global array, on the host."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(array))
    blocks = {}
    for shard in array.addressable_shards:
        start = (shard.index[0].start or 0) if shard.index else 0
        blocks.setdefault(start, shard.data)
    return np.concatenate([np.asarray(blocks[k]) for k in sorted(blocks)], axis=0)


def allgather_rows(local: np.ndarray) -> np.ndarray:
    """Every process's block of rows, concatenated in process order, on every process."""
    if jax.process_count() == 1:
        return np.asarray(local)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(local), tiled=True))


def allgather_strings(local: Sequence[str]) -> list[str]:
    """`allgather_rows` of strings (UTF-8 bytes padded to the longest of any process)."""
    if jax.process_count() == 1:
        return list(local)
    encoded = [s.encode("utf-8") for s in local]
    longest = int(allgather_rows(np.asarray([max((len(b) for b in encoded), default=0)])).max())
    data = np.zeros((len(encoded), max(longest, 1)), np.uint8)
    lengths = np.asarray([len(b) for b in encoded], np.int32)
    for row, b in enumerate(encoded):
        data[row, :len(b)] = np.frombuffer(b, np.uint8)
    data, lengths = allgather_rows(data), allgather_rows(lengths)
    return [bytes(data[i, :lengths[i]]).decode("utf-8") for i in range(len(lengths))]
