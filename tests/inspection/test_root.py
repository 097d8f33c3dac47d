"""A root of step snapshots as ``snapshotkit ls`` reads it (``_inspect/root.py``)."""

from __future__ import annotations

from pathlib import Path

import torch
from _snapshots import MANIFEST, files_of, flip_byte

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit._inspect.root import summarize_root


def test_steps_sizes_records_and_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "run"
    state = {"m": StateDict(w=torch.arange(100.0), step=0)}
    with SnapshotManager(str(root), preemption_signals=()) as mgr:
        mgr.save(10, state, metrics={"loss": 0.5}, metadata={"note": "first"})
        mgr.save(20, state, metrics={"loss": float("nan")})
    Snapshot.take(str(root / "step_30"), state)  # not the manager's
    (root / "step_40" / "data").mkdir(parents=True)
    (root / "step_40" / "data" / "0_00000_0123abcd").write_bytes(b"x")  # never committed
    (root / "step_50").mkdir()  # empty
    Snapshot.take(str(root / "step_60"), state)
    flip_byte(root / "step_60" / MANIFEST, 100)
    summary = summarize_root(str(root) + "/", None)
    assert summary.root == str(root) and not summary.is_snapshot
    by_step = {s.step: s for s in summary.steps}
    assert [s.step for s in summary.steps] == [10, 20, 30, 40, 50, 60]
    assert [s.status for s in summary.steps] == ["complete"] * 3 + ["incomplete"] * 2 + ["damaged"]
    first = by_step[10]
    assert first.size_bytes == sum(len(data) for data in files_of(root / "step_10").values())
    assert (first.metrics, first.reason, first.user_metadata) == ({"loss": 0.5}, "manual", {"note": "first"})
    assert first.created_at == Snapshot(str(root / "step_10")).metadata.created_at
    assert by_step[20].metrics == {"loss": None}
    assert (by_step[30].metrics, by_step[30].reason, by_step[30].user_metadata) == (None, None, {})
    assert by_step[40].size_bytes is None and by_step[40].path == f"{root}/step_40"
    assert by_step[60].error is not None and "integrity" in by_step[60].error


def test_a_snapshot_is_not_a_root(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "s"), {"m": StateDict(x=1)})
    summary = summarize_root(str(tmp_path / "s"), None)
    assert summary.steps == () and summary.is_snapshot
