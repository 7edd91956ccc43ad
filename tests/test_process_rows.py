"""Which batch rows each process holds (parallel.process_rows) and the mesh order that makes
them one block per process (parallel.make_mesh), on fake devices and shardings: no
multi-process launch."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from grpo_jax import parallel
from grpo_jax.parallel.mesh import batch_row_layout, order_by_process
from grpo_jax.parallel.multihost import process_row_layout


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


class FakeSharding:
    """A sharding whose device d holds rows [start, stop) of `spans[d]` (global view)."""

    def __init__(self, spans: dict[FakeDevice, tuple[int, int]]):
        self.spans = spans

    def devices_indices_map(self, shape):
        return {d: (slice(a, b),) for d, (a, b) in self.spans.items()}


def _processes(monkeypatch, count: int, index: int) -> None:
    monkeypatch.setattr(jax, "process_count", lambda: count)
    monkeypatch.setattr(jax, "process_index", lambda: index)


def _sharding(owners: list[int], rows: int, replicas: int = 1) -> FakeSharding:
    """Row block i (of len(owners)) on `replicas` devices of process owners[i]."""
    per = rows // len(owners)
    spans, next_id = {}, 0
    for block, process in enumerate(owners):
        for _ in range(replicas):
            spans[FakeDevice(next_id, process)] = (block * per, (block + 1) * per)
            next_id += 1
    return FakeSharding(spans)


def test_blocks_in_process_order_give_each_process_its_rows(monkeypatch):
    sharding = _sharding([0, 0, 1, 1], rows=16, replicas=2)  # tensor replicas in a process
    assert process_row_layout(sharding, 16) == {0: [(0, 8)], 1: [(8, 16)]}
    for index, span in ((0, (0, 8)), (1, (8, 16))):
        _processes(monkeypatch, 2, index)
        assert parallel.process_rows(sharding, 16) == span


@pytest.mark.parametrize("owners, rows, shown", [
    ([0, 1, 0, 1], 16, "process 0: [0, 4), [8, 12); process 1: [4, 8), [12, 16)"),
    ([1, 1, 0, 0], 16, "process 0: [8, 16); process 1: [0, 8)"),
])
def test_interleaved_or_reversed_rows_are_one_line_naming_the_layout(monkeypatch, owners,
                                                                     rows, shown):
    _processes(monkeypatch, 2, 0)
    with pytest.raises(ValueError) as err:
        parallel.process_rows(_sharding(owners, rows), rows)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"data sharding: the {rows} rows are held as {shown}; expected "
                              "one contiguous block per process in process order")


def test_rows_replicated_across_processes_are_refused(monkeypatch):
    """A tensor axis spanning the processes: both hold every row (a gather would double)."""
    spans = {FakeDevice(i, i % 2): (0, 8) for i in range(4)}
    _processes(monkeypatch, 2, 1)
    with pytest.raises(ValueError, match=r"process 0: \[0, 8\); process 1: \[0, 8\)"):
        parallel.process_rows(FakeSharding(spans), 8)
    with pytest.raises(ValueError, match="does not split over 2 processes"):
        parallel.process_rows(FakeSharding(spans), 7)


def _grid(processes: list[int], shape) -> np.ndarray:
    devices = [FakeDevice(i, p) for i, p in enumerate(processes)]
    return np.asarray(devices, dtype=object).reshape(shape)


def test_make_mesh_order_takes_interleaved_processes_one_after_another():
    # A TPU-like topology order alternating two hosts of 4 devices: data=4 x tensor=2.
    grid = _grid([0, 1] * 4, (4, 2))
    names = ("data", "tensor")
    assert batch_row_layout(grid, names) == {0: [(0, 4)], 1: [(0, 4)]}  # replicated rows
    ordered = order_by_process(grid, names)
    assert batch_row_layout(ordered, names) == {0: [(0, 2)], 1: [(2, 4)]}
    assert [d.id for d in ordered.flat] == [0, 2, 4, 6, 1, 3, 5, 7]  # each host's order kept
    # data=4 x fsdp=2 over 4 hosts, interleaved by host: one data row per host after.
    grid = _grid([0, 1, 2, 3] * 2, (4, 2, 1))
    ordered = order_by_process(grid, ("data", "fsdp", "tensor"))
    assert batch_row_layout(ordered, ("data", "fsdp", "tensor")) == {
        p: [(2 * p, 2 * p + 2)] for p in range(4)}


def test_make_mesh_keeps_an_order_that_works_and_one_no_order_fixes():
    grid = _grid([0, 0, 1, 1], (4,))  # already process by process
    assert order_by_process(grid, ("data",)) is grid
    # tensor=4 spans both hosts of 2 devices: every order replicates rows across hosts.
    grid = _grid([0, 1, 0, 1], (1, 4))
    assert order_by_process(grid, ("data", "tensor")) is grid
    # The batch axis last: taking hosts in turn puts every row on both.
    grid = _grid([0, 1, 0, 1], (2, 2))
    assert order_by_process(grid, ("tensor", "data")) is grid


def test_batch_row_layout_agrees_with_jax_on_real_devices():
    """The shard each mesh position holds, as computed for the ordering, is jax's."""
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharding = NamedSharding(mesh, P(("data", "fsdp")))
    by_device = {d: index[0].start for d, index in sharding.devices_indices_map((4,)).items()}
    names = list(mesh.axis_names)
    for position in np.ndindex(mesh.devices.shape):
        expected = position[names.index("data")] * 2 + position[names.index("fsdp")]
        assert by_device[mesh.devices[position]] == expected
    assert batch_row_layout(mesh.devices, mesh.axis_names) == {0: [(0, 4)]}
    assert process_row_layout(sharding, 8) == {0: [(0, 8)]}
    assert order_by_process(mesh.devices, mesh.axis_names) is mesh.devices
