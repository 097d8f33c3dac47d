"""Lifecycle events on 2 real gloo ranks: each rank reports its own take and restore, with its rank."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict, events
from snapshotkit._events import step_scope

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _record(rank: int, world: int, path: str) -> list[tuple[Any, ...]]:
    seen: list[events.Event] = []
    events.subscribe(seen.append)
    state = StateDict(mine=torch.full((50_000,), float(rank)), shared=torch.arange(30_000.0))
    with step_scope(5):
        Snapshot.take(f"{path}/take", {"s": state}, replicated=["s/shared"])
        Snapshot.async_take(f"{path}/async", {"s": state}, replicated=["s/shared"]).wait()
        Snapshot(f"{path}/take").restore({"s": state})
    return [(e.kind, e.path, e.rank, e.step, e.nbytes, e.error, e.received_bytes) for e in seen]


def _data_bytes(path: str, rank: int) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{path}/data/{rank}_*"))


def test_each_rank_reports_its_own_events(tmp_path: Path) -> None:
    path = str(tmp_path)
    results = run_ranks(2, _record, path)
    for rank, seen in enumerate(results):
        assert [kind for kind, *_ in seen] == [
            "take_started",
            "take_staged",
            "take_committed",
            "take_started",
            "take_staged",
            "take_committed",
            "restore_finished",
        ]
        assert {r for _, _, r, *_ in seen} == {rank}
        assert {step for _, _, _, step, *_ in seen} == {5}
        assert {error for *_, error, _ in seen} == {None}
        assert [p for _, p, *_ in seen] == [f"{path}/take"] * 3 + [f"{path}/async"] * 3 + [f"{path}/take"]
        # each rank's bytes are the data objects it wrote (the replicated tensor is written once)
        assert seen[1][4] == seen[2][4] == _data_bytes(f"{path}/take", rank) > 0
        assert seen[4][4] == seen[5][4] == _data_bytes(f"{path}/async", rank) > 0
        # the restore reads this rank's tensor and the replicated one, wherever it was written (one
        # host reading a local file system: replicated reads are not shared by default)
        stored = _data_bytes(f"{path}/take", 0) + _data_bytes(f"{path}/take", 1)
        assert seen[6][4] is not None and (50_000 + 30_000) * 4 <= seen[6][4] <= stored
        assert seen[6][6] == 0


def _fail_on_rank_1(rank: int, world: int, path: str) -> list[tuple[str, int, str, bool]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
    import _storage_doubles

    _storage_doubles.register()
    seen: list[events.Event] = []
    events.subscribe(seen.append)
    raised: BaseException | None = None
    try:
        Snapshot.take(f"failing://{path}", {"s": StateDict(x=torch.ones(1000))})
    except Exception as exc:
        raised = exc
    # (kind, rank, the error's class, whether it is the very exception take raised)
    return [(e.kind, e.rank, type(e.error).__name__, e.error is raised) for e in seen]


def test_a_failing_rank_and_the_others_each_report_take_failed(tmp_path: Path) -> None:
    results = run_ranks(2, _fail_on_rank_1, str(tmp_path / "snap"), env={"SNAPSHOTKIT_TEST_FAIL_RANK": "1"})
    assert results[0] == [
        ("take_started", 0, "NoneType", False),
        ("take_staged", 0, "NoneType", False),  # rank 0 wrote its data; the commit failed
        ("take_failed", 0, "RankFailedError", True),
    ]
    assert results[1] == [("take_started", 1, "NoneType", False), ("take_failed", 1, "StorageError", True)]
