"""Rank 0's housekeeping (``_lifecycle/janitor.py``): retention and clean-up say what they delete, and can dry-run."""

from __future__ import annotations

from pathlib import Path

import torch
from _snapshots import files_of

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit._lifecycle.janitor import RootJanitor
from snapshotkit._lifecycle.retention import RetentionPolicy


def _root(root: Path) -> None:
    with SnapshotManager(str(root), preemption_signals=()) as mgr:
        for step in (1, 2, 3, 4):
            mgr.save(step, {"m": StateDict(w=torch.full((4,), float(step)))})
    Snapshot.take(str(root / "step_0"), {"m": StateDict(x=1)})  # not the manager's
    (root / "step_9" / "data").mkdir(parents=True)
    (root / "step_9" / "data" / "0_00000_0123abcd").write_bytes(b"partial")


def test_retain_returns_the_steps_it_deletes_and_can_dry_run(tmp_path: Path) -> None:
    _root(tmp_path / "run")
    before = files_of(tmp_path / "run")
    janitor = RootJanitor(str(tmp_path / "run"), {})
    policy = RetentionPolicy(keep_last=2)
    assert janitor.retain(policy, dry_run=True) == [1, 2]
    assert files_of(tmp_path / "run") == before
    assert janitor.retain(policy) == [1, 2]
    assert janitor.listing().committed == [0, 3, 4]
    assert janitor.retain(RetentionPolicy()) == []  # a policy that never deletes


def test_cleanup_can_dry_run(tmp_path: Path) -> None:
    _root(tmp_path / "run")
    before = files_of(tmp_path / "run")
    janitor = RootJanitor(str(tmp_path / "run"), {})
    removed, listing = janitor.cleanup(None, dry_run=True)
    assert (removed, listing.incomplete) == ([9], [9])
    assert files_of(tmp_path / "run") == before
    assert janitor.cleanup(None)[0] == [9]
    assert not (tmp_path / "run" / "step_9").exists()
