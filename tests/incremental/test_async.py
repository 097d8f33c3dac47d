"""``async_take(base=...)``: both executors reference the base's pieces, and what the caller does
to its tensors once ``async_take`` returned is not in the snapshot."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, referenced

NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_async_incremental_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)
    state = {
        "s": StateDict(w=torch.arange(NUMEL, dtype=torch.float32), v=torch.ones(NUMEL, dtype=torch.float64), step=1)
    }
    Snapshot.async_take(str(tmp_path / "a"), state, executor=executor).wait(60)
    state["s"]["w"][0] = -1.0
    state["s"]["step"] = 2
    expected = copy.deepcopy(dict(state["s"]))
    pending = Snapshot.async_take(str(tmp_path / "b"), state, executor=executor, base=str(tmp_path / "a"))
    # from here on the caller's changes are not the snapshot's
    state["s"]["w"].fill_(3.0)
    state["s"]["v"][: NUMEL // 2] = 0.0
    state["s"]["step"] = 3
    snapshot = pending.wait(60)

    assert referenced(snapshot, "s/w") == [None, "../a", "../a", "../a"]
    assert referenced(snapshot, "s/v") == ["../a"] * 8
    assert snapshot.metadata.bases == {"../a": Snapshot(str(tmp_path / "a")).metadata.snapshot_id}
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("s"), expected)
    Snapshot(str(tmp_path / "b")).restore(state)
    assert_bit_exact(dict(state["s"]), expected)
