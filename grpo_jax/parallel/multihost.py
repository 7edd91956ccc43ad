"""Multi-controller helpers: which rows of a batch this process holds, host data <-> global
arrays, and gathers of host results.

In a multi-controller run every process runs the same program over one global mesh. A batch
sharded over the data axes puts a contiguous block of rows on each process's devices, block p
on process p, when the mesh's devices run process by process (`make_mesh` orders them so);
`process_rows` says which block, and `process_row_layout` where every process's rows are
under any sharding. A process encodes only its block, `to_global` assembles the global
array from every process's block (`jax.make_array_from_process_local_data`), `local_rows`
reads this process's block of a global array back to the host, and `allgather_rows` /
`allgather_strings` give every process the whole batch of small host results (rewards,
lengths, texts). With one process all of these are plain copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

__all__ = ["allgather_rows", "allgather_strings", "is_primary", "local_rows", "lost_peer",
           "process_row_layout", "process_rows", "row_layout_problem", "sync", "to_global"]

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


def _merged(spans) -> list[tuple[int, int]]:
    """Sorted [start, stop) spans with overlapping and adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def process_row_layout(sharding, rows: int) -> dict[int, list[tuple[int, int]]]:
    """{process index: the merged, sorted [start, stop) spans of the rows of a [rows, ...]
    batch that its devices hold under `sharding`}, for every process of the sharding (read
    from `sharding.devices_indices_map` and each device's `process_index`; no collective)."""
    spans: dict[int, set] = {}
    for device, index in sharding.devices_indices_map((rows,)).items():
        start, stop, _ = index[0].indices(rows) if index else (0, rows, 1)
        spans.setdefault(int(device.process_index), set()).add((start, stop))
    return {process: _merged(held) for process, held in sorted(spans.items())}


def row_layout_problem(layout: dict[int, list[tuple[int, int]]], rows: int,
                       count: int) -> str | None:
    """Why `layout` (`process_row_layout`) is not one contiguous block of rows per process,
    block p on process p, over `count` processes, in a few words naming the layout; None
    when it is."""
    per = rows // count
    expected = {p: [(p * per, (p + 1) * per)] for p in range(count)}
    if rows % count == 0 and layout == expected:
        return None
    shown = "; ".join(f"process {p}: " + ", ".join(f"[{a}, {b})" for a, b in spans)
                      for p, spans in list(layout.items())[:8])
    more = f"; ... ({len(layout)} processes)" if len(layout) > 8 else ""
    return f"the {rows} rows are held as {shown}{more}"


def process_rows(sharding, rows: int) -> tuple[int, int]:
    """[start, stop) of the rows of a [rows, ...] batch under `sharding` on this process.

    Holds for any order of the mesh's devices in which every process's rows form one block,
    block p on process p (what `allgather_rows` assumes): a layout `make_mesh` gives unless
    the tensor axis spans processes or the batch axes do not lead the mesh.

    Raises:
      ValueError: the rows do not split over the processes, or not into such blocks (the
        message names every process's rows).
    """
    count, index = jax.process_count(), jax.process_index()
    if rows % count:
        raise ValueError(f"a batch of {rows} rows does not split over {count} processes")
    problem = row_layout_problem(process_row_layout(sharding, rows), rows, count)
    if problem:
        raise ValueError(
            f"data sharding: {problem}; expected one contiguous block per process in process "
            "order: build the mesh with grpo_jax.parallel.make_mesh (it orders the devices "
            "by process) with the data axes first and the tensor axis within a host")
    per = rows // count
    return index * per, (index + 1) * per


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
