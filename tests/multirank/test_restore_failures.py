"""A restore that fails on one rank fails on every rank, with real gloo ranks: ``Snapshot.restore``
(a rank failing after the others loaded, a rank that cannot open the snapshot) and
``SnapshotManager.restore_latest`` (every rank raises ``PartialRestoreError`` together)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit.errors import PartialRestoreError

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # 1-2 s each, 5 s with the ranks' start-up


def _weights(rank: int) -> StateDict:
    return StateDict(w=torch.full((1000,), float(rank + 1)), step=rank)


class _FailsToLoad:
    """A Stateful whose load_state_dict raises, after the ranks' other keys were loaded."""

    def state_dict(self) -> dict[str, Any]:
        return {"x": 1}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise ValueError("load_state_dict refused on purpose")


def _take(rank: int, world: int, path: str) -> None:
    Snapshot.take(path, {"a": _weights(rank), "z": StateDict(x=1)})


def _restore_failing_on_rank_one(rank: int, world: int, path: str) -> dict[str, Any]:
    destination = StateDict(w=torch.zeros(1000), step=-1)
    app_state: dict[str, Any] = {"a": destination, "z": _FailsToLoad() if rank == 1 else StateDict(x=0)}
    try:
        Snapshot(path).restore(app_state)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "loaded": destination["step"] == rank}
    return {"error": None, "loaded": destination["step"] == rank}


def test_a_rank_failing_after_the_others_loaded_fails_every_rank(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    run_ranks(2, _take, path, timeout=120)
    results = run_ranks(2, _restore_failing_on_rank_one, path, timeout=120)
    assert results[0]["loaded"]  # rank 0 had loaded its state when rank 1 failed...
    assert results[0]["error"].startswith("RankFailedError: restore: loading the state: rank 1 failed")  # ...and raises
    assert "load_state_dict refused on purpose" in results[0]["error"]
    assert results[1]["error"] == "ValueError: load_state_dict refused on purpose"


def _restore_where_rank_one_finds_nothing(rank: int, world: int, path: str, elsewhere: str) -> str:
    started = time.monotonic()
    try:
        Snapshot(path if rank == 0 else elsewhere).restore({"a": StateDict(w=torch.zeros(1000), step=-1)})
    except Exception as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.0f} s: {exc}"
    return "restored"


def test_a_rank_that_cannot_open_the_snapshot_fails_every_rank_at_once(tmp_path: Path) -> None:
    # Before: rank 1 raised SnapshotNotFoundError before the restore's collectives, and rank 0
    # waited in them until rank 1's process went away (a gloo RuntimeError) or, while it lived
    # on, until the collective timeout (30 min by default).
    path = str(tmp_path / "snap")
    run_ranks(2, _take, path, timeout=120)
    env = {"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "20"}
    results = run_ranks(2, _restore_where_rank_one_finds_nothing, path, str(tmp_path / "none"), timeout=120, env=env)
    assert results[0].startswith("RankFailedError after 0 s: restore: "), results[0]
    assert "rank 1 failed with snapshotkit.errors.SnapshotNotFoundError" in results[0]
    assert results[1].startswith("SnapshotNotFoundError after 0 s"), results[1]


def _save_with_manager(rank: int, world: int, root: str) -> None:
    with SnapshotManager(root, async_executor=None) as mgr:
        mgr.save(10, {"a": _weights(rank)})


def _restore_latest(rank: int, world: int, root: str) -> dict[str, Any]:
    import warnings

    destination = StateDict(w=torch.zeros(1000), step=-1)
    with SnapshotManager(root, async_executor=None) as mgr:
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                step = mgr.restore_latest({"a": destination})
        except PartialRestoreError as exc:
            return {"error": "PartialRestoreError", "attempts": exc.attempts, "message": str(exc)}
    return {"error": None, "step": step}


def test_restore_latest_raises_on_every_rank_when_one_rank_read_a_damaged_snapshot(tmp_path: Path) -> None:
    # Before: rank 1's checksum failed after its tensors were filled, rank 0 had loaded its own
    # state; both agreed to skip the snapshot, found nothing older and returned None.
    root = tmp_path / "root"
    run_ranks(2, _save_with_manager, str(root), timeout=120)
    manifest = Snapshot(str(root / "step_10")).get_manifest()
    piece = manifest["1/a/w"].pieces[0]
    data_object = root / "step_10" / piece.location
    damaged = bytearray(data_object.read_bytes())
    damaged[piece.byte_range[0]] ^= 0xFF
    data_object.write_bytes(bytes(damaged))
    results = run_ranks(2, _restore_latest, str(root), timeout=120)
    for rank, result in enumerate(results):
        assert result["error"] == "PartialRestoreError", (rank, result)
        [(step, why)] = result["attempts"]
        assert step == 10 and "ChecksumMismatchError" in why and "'a/w'" in why
        assert "may have written into the state" in result["message"]


def _save_with_an_object(rank: int, world: int, root: str) -> None:
    with SnapshotManager(root, async_executor=None) as mgr:
        mgr.save(10, {"a": StateDict(w=torch.full((1000,), float(rank + 1)), seen={rank})})


def _restore_latest_with_an_object(rank: int, world: int, root: str) -> dict[str, Any]:
    import warnings

    destination = StateDict(w=torch.zeros(1000), seen=set())
    with SnapshotManager(root, async_executor=None) as mgr, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = mgr.restore_latest({"a": destination})
    return {"step": step, "untouched": bool((destination["w"] == 0).all()), "warnings": len(caught)}


def test_restore_latest_returns_none_on_every_rank_when_nothing_was_written(tmp_path: Path) -> None:
    # Rank 1's data object is truncated: it fails checking extents, before any read; rank 0 learns
    # of it when the ranks agree on sharing reads, before any read either. None, on both ranks.
    root = tmp_path / "root"
    run_ranks(2, _save_with_an_object, str(root), timeout=120)
    manifest = Snapshot(str(root / "step_10")).get_manifest()
    data_object = root / "step_10" / manifest["1/a/seen"].piece.location
    data_object.write_bytes(data_object.read_bytes()[:-1])
    results = run_ranks(2, _restore_latest_with_an_object, str(root), timeout=120)
    assert results == [{"step": None, "untouched": True, "warnings": 1}] * 2
