"""Resharding a ``Shard(1)`` DTensor onto another world size reads about the bytes it needs.

A take stores each rank's column box as column sub-boxes (``_format.sharded.column_split``), so a
restore needing part of a box's columns reads only the sub-boxes holding them, each piece whole
and verified. Real gloo ranks: taken on 4, restored on 2 and 3, into DTensors, a plain tensor and
``read_object``; the bytes each rank read come from its ``restore_finished`` event.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from snapshotkit import Snapshot, StateDict, events
from snapshotkit._format import sharded
from snapshotkit.manifest import ShardedTensorEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

ROWS, COLUMNS = 256, 32768  # float32, 32 MiB: 8 MiB per rank on 4 ranks, 8 sub-boxes of 1 MiB each


def _full() -> torch.Tensor:
    return torch.arange(ROWS * COLUMNS, dtype=torch.float32).reshape(ROWS, COLUMNS)


def _take(rank: int, world: int, path: str, max_parts: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    sharded.COLUMN_SPLIT_MAX_PARTS = max_parts  # 1: the layout takes wrote before the split
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    Snapshot.take(path, {"m": StateDict(w=distribute_tensor(_full(), mesh, [Shard(1)]))})


def _restore(rank: int, world: int, path: str) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    read: list[int] = []
    unsubscribe = events.subscribe(lambda e: read.append(e.nbytes) if e.kind == "restore_finished" else None)
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    destination = distribute_tensor(torch.zeros(ROWS, COLUMNS), mesh, [Shard(1)])
    Snapshot(path).restore({"m": StateDict(w=destination)})
    plain = torch.zeros(ROWS, COLUMNS)
    Snapshot(path).restore({"m": StateDict(w=plain)})
    unsubscribe()
    local = distribute_tensor(torch.zeros(ROWS, COLUMNS), mesh, [Shard(1)])
    Snapshot(path).read_object("m/w", obj_out=local)
    full = _full()
    return {
        "dtensor": torch.equal(destination.full_tensor(), full),
        "plain": torch.equal(plain, full),
        "read_object": torch.equal(Snapshot(path).read_object("m/w"), full),
        "read_object_into_dtensor": torch.equal(local.full_tensor(), full),
        "needed_bytes": math.prod(destination.to_local().shape) * 4,
        "read_bytes": read,
    }


@pytest.mark.parametrize("restored", [2, 3])
def test_shard1_reshard_reads_about_the_bytes_it_needs(tmp_path: Path, restored: int) -> None:
    path = str(tmp_path / "snap")
    run_ranks(4, _take, path, sharded.COLUMN_SPLIT_MAX_PARTS)
    entry = Snapshot(path).get_manifest()["0/m/w"]
    assert isinstance(entry, ShardedTensorEntry)
    assert len(entry.shards) == 4 * 8  # every rank's 8 MiB box as 8 column sub-boxes
    assert {shard.sizes for shard in entry.shards} == {(ROWS, COLUMNS // 32)}
    for result in run_ranks(restored, _restore, path):
        assert result["dtensor"] and result["plain"] and result["read_object"] and result["read_object_into_dtensor"]
        into_dtensor, into_plain = result["read_bytes"]
        # one probe byte per data object besides the pieces; a split box is read only where needed
        assert result["needed_bytes"] <= into_dtensor <= 1.2 * result["needed_bytes"]
        assert ROWS * COLUMNS * 4 <= into_plain <= ROWS * COLUMNS * 4 + 64


def test_unsplit_boxes_still_restore_and_read_whole_boxes(tmp_path: Path) -> None:
    """The layout of takes before the split (one stored box per rank) restores bit-exactly; it
    reads whole boxes, which is what the split avoids."""
    path = str(tmp_path / "snap")
    run_ranks(4, _take, path, 1)
    entry = Snapshot(path).get_manifest()["0/m/w"]
    assert isinstance(entry, ShardedTensorEntry)
    assert {shard.sizes for shard in entry.shards} == {(ROWS, COLUMNS // 4)}
    for result in run_ranks(3, _restore, path):
        assert result["dtensor"] and result["plain"] and result["read_object"] and result["read_object_into_dtensor"]
        assert result["read_bytes"][0] >= 1.4 * result["needed_bytes"]
