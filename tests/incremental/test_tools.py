"""diff and import around incremental snapshots: an incremental snapshot compares like the full one
of the same state, and an imported snapshot serves as a base."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.convert import import_snapshot
from snapshotkit.diff import diff_snapshots

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, referenced

NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)


def make_state() -> dict[str, Any]:
    return {"s": StateDict(big=torch.arange(NUMEL, dtype=torch.float32), other=torch.ones(NUMEL), step=1)}


def test_diff_sees_an_incremental_snapshot_as_its_state(tmp_path: Path) -> None:
    state = make_state()
    Snapshot.take(str(tmp_path / "a"), state)
    state["s"]["big"][-1] = -1.0
    Snapshot.take(str(tmp_path / "full"), state)
    Snapshot.take(str(tmp_path / "incremental"), state, base=str(tmp_path / "a"))
    assert "../a" in referenced(str(tmp_path / "incremental"), "s/other")

    same = diff_snapshots(str(tmp_path / "full"), str(tmp_path / "incremental"))
    assert same.identical
    assert same.compared == 3
    changed = diff_snapshots(str(tmp_path / "a"), str(tmp_path / "incremental"))
    assert [change.logical_path for change in changed.changed] == ["s/big"]


def test_an_imported_snapshot_is_a_base(tmp_path: Path) -> None:
    weights = {"w": torch.arange(NUMEL, dtype=torch.float32), "v": torch.ones(NUMEL)}
    torch.save(weights, tmp_path / "weights.pt")
    import_snapshot(tmp_path / "weights.pt", tmp_path / "imported")
    base = Snapshot(str(tmp_path / "imported"))
    assert base.metadata.snapshot_id is not None
    [key] = {path.split("/")[1] for path in base.metadata.manifest if path.count("/") == 1}
    state = {key: StateDict(**copy.deepcopy(weights))}
    state[key]["v"][0] = 5.0
    Snapshot.take(str(tmp_path / "incremental"), state, base=str(tmp_path / "imported"))
    assert referenced(str(tmp_path / "incremental"), f"{key}/w") == ["../imported"] * 4
    target = {key: StateDict(w=torch.zeros(NUMEL), v=torch.zeros(NUMEL))}
    Snapshot(str(tmp_path / "incremental")).restore(target)
    assert_bit_exact(dict(target[key]), dict(state[key]))
