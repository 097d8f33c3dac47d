"""Incremental takes on two gloo ranks: replicated and rank-local state, and DTensors resharded
between takes and restores (2 ranks -> 1, 1 rank -> 2)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from multirank._harness import run_ranks

from snapshotkit import Snapshot, StateDict

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, pieces, referenced

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces
ROWS, COLS = 256, 64  # float32: 64 rows (16 KiB) per piece, two pieces per half


def _replicated_and_local(rank: int, world: int, root: str) -> dict[str, Any]:
    state = {
        "model": StateDict(w=torch.arange(NUMEL, dtype=torch.float32)),  # the same on every rank
        "local": StateDict(x=torch.full((NUMEL,), float(rank)), tag=f"rank-{rank}"),
    }
    Snapshot.take(f"{root}/a", state, replicated=["model/**"])
    state["model"]["w"][-1] = 0.5  # on every rank: the last piece changes
    if rank == 1:
        state["local"]["x"][0] = -1.0  # rank 1's first piece changes, rank 0's state does not
    expected = copy.deepcopy({k: dict(v) for k, v in state.items()})
    Snapshot.take(f"{root}/b", state, replicated=["model/**"], base=f"{root}/a")
    for value in state.values():
        for key in value:
            if isinstance(value[key], torch.Tensor):
                value[key].zero_()
    Snapshot(f"{root}/b").restore(state)
    assert_bit_exact({k: dict(v) for k, v in state.items()}, expected, f"rank {rank}")
    return {"local": referenced(f"{root}/b", "local/x", rank)}


def test_replicated_and_rank_local_state(tmp_path: Path) -> None:
    results = run_ranks(2, _replicated_and_local, str(tmp_path), env=SMALL_PIECES)
    assert results[0]["local"] == ["../a"] * 4
    assert results[1]["local"] == [None, "../a", "../a", "../a"]
    assert referenced(str(tmp_path / "b"), "model/w") == ["../a", "../a", "../a", None]
    assert "1/model/w" not in Snapshot(str(tmp_path / "b")).get_manifest()


def _full() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


def _take_sharded(rank: int, world: int, root: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    full = _full()
    Snapshot.take(f"{root}/a", {"t": StateDict(w=distribute_tensor(full, mesh, [Shard(0)]))})
    full[0] += 1  # the first row block of rank 0's half
    Snapshot.take(f"{root}/b", {"t": StateDict(w=distribute_tensor(full, mesh, [Shard(0)]))}, base=f"{root}/a")


def _restore_sharded(rank: int, world: int, root: str, name: str, dim: int = 1) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    expected = _full()
    expected[0] += 1
    destination = distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(dim)])
    Snapshot(f"{root}/{name}").restore({"t": StateDict(w=destination)})
    assert_bit_exact(destination.full_tensor(), expected)
    assert_bit_exact(Snapshot(f"{root}/{name}").read_object("t/w"), expected)


def test_two_ranks_to_one_and_one_to_two(tmp_path: Path) -> None:
    expected = _full()
    expected[0] += 1
    # 2 -> 1: a DTensor snapshot taken incrementally by two ranks, read and restored by one
    run_ranks(2, _take_sharded, str(tmp_path), env=SMALL_PIECES)
    found = [piece.base for piece in pieces(str(tmp_path / "b"), "t/w")]
    assert sorted(found, key=str) == ["../a", "../a", "../a", None]
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("t/w"), expected)
    target = {"t": StateDict(w=torch.zeros(ROWS, COLS))}
    Snapshot(str(tmp_path / "b")).restore(target)
    assert_bit_exact(target["t"]["w"], expected)
    # and by two ranks again, into another layout
    run_ranks(2, _restore_sharded, str(tmp_path), "b", env=SMALL_PIECES)


@pytest.mark.parametrize("dim", [0, 1])
def test_one_rank_to_two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dim: int) -> None:
    # Before: a plain stored tensor was read straight into a DTensor destination's wrapper (no
    # memory of its own): OSError EFAULT, for full snapshots too. Now each rank fills its shards.
    # replicated: a new rank sees only replicated state of a one-rank snapshot (format.md 3.6).
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)
    full = _full()
    Snapshot.take(str(tmp_path / "one_a"), {"t": StateDict(w=full)}, replicated=["**"])
    full[0] += 1
    b = Snapshot.take(
        str(tmp_path / "one_b"), {"t": StateDict(w=full)}, base=str(tmp_path / "one_a"), replicated=["**"]
    )
    assert referenced(b, "t/w") == [None, "../one_a", "../one_a", "../one_a"]
    run_ranks(2, _restore_sharded, str(tmp_path), "one_b", dim, env=SMALL_PIECES)
