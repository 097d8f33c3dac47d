"""Resharding a ``Shard(0)`` (FSDP) DTensor into ``Shard(1)`` reads about the bytes it needs.

A take stores each rank's full-width box of at least 32 MiB as column sub-boxes of at least
16 MiB (``_format.sharded.column_split``), so a ``Shard(1)`` restore reads only the sub-boxes
holding its columns, each piece whole and verified, and a ``Shard(0)`` restore still reads
exactly its rows. Real gloo ranks: taken on 4, restored on 2; the bytes each rank read (its
``restore_finished`` event) are checked against the pieces the manifest says its box overlaps.
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
from snapshotkit._format.sharded import Box, overlap, piece_boxes
from snapshotkit.manifest import ShardedTensorEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

# float32, 128 MiB: a 32 MiB Shard(0) box per rank on 4 ranks, stored as 2 sub-boxes of 2,048 columns
ROWS, COLUMNS = 8192, 4096


def _full() -> torch.Tensor:
    return torch.arange(ROWS * COLUMNS, dtype=torch.float32).reshape(ROWS, COLUMNS)


def _take(rank: int, world: int, path: str, max_parts: int) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    sharded.COLUMN_SPLIT_MAX_PARTS = max_parts  # 1: the layout takes wrote before the split
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    Snapshot.take(path, {"m": StateDict(w=distribute_tensor(_full(), mesh, [Shard(0)]))})


def _restore(rank: int, world: int, path: str, dim: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    read: list[int] = []
    unsubscribe = events.subscribe(lambda e: read.append(e.nbytes) if e.kind == "restore_finished" else None)
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    destination = distribute_tensor(torch.zeros(ROWS, COLUMNS), mesh, [Shard(dim)])
    Snapshot(path).restore({"m": StateDict(w=destination)})
    unsubscribe()
    return {"exact": torch.equal(destination.full_tensor(), _full()), "read_bytes": read[0]}


def _planned(entry: ShardedTensorEntry, box: Box) -> tuple[int, int]:
    """The bytes of the stored pieces overlapping ``box``, and the data objects they lie in."""
    nbytes, locations = 0, set()
    for shard in entry.shards:
        sizes = [piece.nbytes for piece in shard.pieces]
        for piece, piece_box in zip(shard.pieces, piece_boxes(Box(shard.offsets, shard.sizes), sizes, 4), strict=True):
            if overlap(piece_box, box) is not None:
                nbytes += piece.nbytes
                locations.add(piece.location)
    return nbytes, len(locations)


def _box(rank: int, world: int, dim: int) -> Box:
    sizes = [ROWS, COLUMNS]
    sizes[dim] //= world
    offsets = [0, 0]
    offsets[dim] = rank * sizes[dim]
    return Box(tuple(offsets), tuple(sizes))


@pytest.mark.parametrize("dim", [1, 0])
def test_shard0_to_shard_dim_reads_the_planned_bytes(tmp_path: Path, dim: int) -> None:
    path = str(tmp_path / "snap")
    run_ranks(4, _take, path, sharded.COLUMN_SPLIT_MAX_PARTS)
    entry = Snapshot(path).get_manifest()["0/m/w"]
    assert isinstance(entry, ShardedTensorEntry)
    assert {shard.sizes for shard in entry.shards} == {(ROWS // 4, COLUMNS // 2)}  # 4 boxes x 2 column parts
    needed = ROWS * COLUMNS * 4 // 2
    for rank, result in enumerate(run_ranks(2, _restore, path, dim)):
        assert result["exact"]
        planned, objects = _planned(entry, _box(rank, 2, dim))
        assert planned == needed  # the parts align with the 2 ranks' columns (and rows): 1.000x
        # the planned pieces, plus one probe byte per data object read
        assert planned <= result["read_bytes"] <= planned + objects


def test_whole_rows_read_twice_the_bytes_a_shard1_rank_needs(tmp_path: Path) -> None:
    """The layout before the split (one full-width box per rank) restores bit-exactly into
    ``Shard(1)``, reading every row block its columns cross: what the split avoids."""
    path = str(tmp_path / "snap")
    run_ranks(4, _take, path, 1)
    entry = Snapshot(path).get_manifest()["0/m/w"]
    assert isinstance(entry, ShardedTensorEntry)
    assert {shard.sizes for shard in entry.shards} == {(ROWS // 4, COLUMNS)}
    for rank, result in enumerate(run_ranks(2, _restore, path, 1)):
        assert result["exact"]
        planned, objects = _planned(entry, _box(rank, 2, 1))
        assert planned == ROWS * COLUMNS * 4 == 2 * math.prod(_box(rank, 2, 1).sizes) * 4
        assert planned <= result["read_bytes"] <= planned + objects
