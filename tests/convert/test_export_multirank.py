"""Exporting a snapshot two gloo ranks took: sharded DTensors assembled (torch, safetensors) or kept
as DCP chunks, in the one process that exports."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from multirank._harness import run_ranks

from snapshotkit import Snapshot, StateDict
from snapshotkit.convert import export_snapshot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("clean_env"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _full() -> torch.Tensor:
    return torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)


def _take(rank: int, world: int, path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    state = StateDict(
        rows=distribute_tensor(_full(), mesh, [Shard(0)]),
        middle=distribute_tensor(_full(), mesh, [Shard(1)]),
        own=torch.full((2,), float(rank)),
    )
    Snapshot.take(path, {"t": state})


def test_export_of_a_two_rank_sharded_snapshot(tmp_path: Path) -> None:
    snap = str(tmp_path / "snap")
    run_ranks(2, _take, snap)
    full = _full()

    export_snapshot(snap, tmp_path / "t.safetensors", to="safetensors")
    loaded = safetensors.torch.load_file(tmp_path / "t.safetensors")
    assert torch.equal(loaded["t.rows"], full) and torch.equal(loaded["t.middle"], full)
    assert torch.equal(loaded["t.own"], torch.zeros(2))  # rank 0's own state

    export_snapshot(snap, tmp_path / "t.pt", to="torch")
    state = torch.load(tmp_path / "t.pt", weights_only=True)["t"]
    assert torch.equal(state["rows"], full) and torch.equal(state["middle"], full)

    export_snapshot(snap, tmp_path / "ckpt", to="dcp")
    metadata = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    assert [list(c.offsets) for c in metadata["t.middle"].chunks] == [[0, 0, 0], [0, 3, 0]]
    destination = {"t": {"rows": torch.zeros(4, 6, 5), "middle": torch.zeros(4, 6, 5), "own": torch.ones(2)}}
    dcp.load(destination, checkpoint_id=str(tmp_path / "ckpt"))
    assert torch.equal(destination["t"]["rows"], full) and torch.equal(destination["t"]["middle"], full)
    assert torch.equal(destination["t"]["own"], torch.zeros(2))
