"""A node's local root (snapshotkit._tier.local): layout, listing, clean-up and retention with real
snapshots on disk, and the checks of the local tier's options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._tier.local import LocalRoot, local_root_path
from snapshotkit._tier.tier import check_tier_options
from snapshotkit._tier.transfer import INCOMING_INFIX
from snapshotkit.errors import ConfigError, InvalidArgumentError


def _copy(root: LocalRoot, step: int, owner: int) -> Path:
    path = root.copy_path(step, owner)
    Snapshot.take(str(path), {"s": StateDict(w=torch.full((4,), float(step * 10 + owner)))})
    return path


def test_layout_and_listing(tmp_path: Path) -> None:
    root = LocalRoot(tmp_path / "local", {0, 3})
    assert root.copies() == [] and root.holdings() == frozenset()  # a root that does not exist yet
    for step, owner in [(2, 0), (2, 3), (2, 1), (4, 0)]:
        _copy(root, step, owner)
    assert root.copy_path(2, 3) == tmp_path / "local" / "step_2" / "rank_3"
    assert [(c.step, c.owner) for c in root.copies()] == [(2, 0), (2, 1), (2, 3), (4, 0)]
    assert root.holdings() == {(2, 0), (2, 3), (4, 0)}  # rank 1's copy is another rank's to manage
    assert root.steps(0) == [2, 4]


def test_cleanup_removes_incomplete_and_incoming_copies_of_managed_owners_only(tmp_path: Path) -> None:
    root = LocalRoot(tmp_path, {0})
    kept = _copy(root, 2, 0)
    cut_short = _copy(root, 4, 0)
    (cut_short / METADATA_FILENAME).unlink()  # a take killed before its commit
    incoming = tmp_path / "step_4" / f"rank_0{INCOMING_INFIX}0123456789abcdef"
    incoming.mkdir()
    (incoming / "part").write_bytes(b"x")
    others = _copy(root, 4, 1)
    (others / METADATA_FILENAME).unlink()  # rank 1 may still be writing it: not ours
    removed = root.cleanup()
    assert set(removed) == {cut_short, incoming}
    assert kept.exists() and others.exists() and not cut_short.exists() and not incoming.exists()
    assert root.holdings() == {(2, 0)}


def test_retain_deletes_older_steps_manifest_first_and_leaves_foreign_files(tmp_path: Path) -> None:
    root = LocalRoot(tmp_path, {0, 2})
    for step in (2, 4, 6):
        _copy(root, step, 0)
        _copy(root, step, 2)
    _copy(root, 2, 1)  # another rank's
    (tmp_path / "step_2" / "notes.txt").write_text("mine")
    in_flight = root.copy_path(8, 0)
    (in_flight / "data").mkdir(parents=True)  # an async take of step 8 not committed yet
    assert root.retain(2) == [2]
    assert in_flight.exists()
    assert root.holdings() == {(4, 0), (4, 2), (6, 0), (6, 2)}
    assert (tmp_path / "step_2" / "rank_1" / METADATA_FILENAME).exists()
    assert (tmp_path / "step_2" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "step_2" / "rank_0").exists()


def test_local_root_paths(tmp_path: Path) -> None:
    assert local_root_path(str(tmp_path)) == tmp_path
    assert local_root_path(f"file://{tmp_path}") == tmp_path
    with pytest.raises(ConfigError, match="own storage"):
        local_root_path("s3://bucket/local")


def test_tier_options_are_checked_before_anything_runs(tmp_path: Path) -> None:
    assert check_tier_options(None, None, 2, 0) is None
    options = check_tier_options(str(tmp_path), 50, 2, 1)
    assert options is not None and (options.root, options.interval_steps, options.replicas) == (tmp_path, 50, 1)
    with pytest.raises(ConfigError, match="local_interval_steps"):
        check_tier_options(str(tmp_path), None, 2, 0)
    with pytest.raises(ConfigError, match="local_root"):
        check_tier_options(None, 50, 2, 0)
    for bad in [(0, 2, 0), (50, 0, 0), (50, 2, -1), (True, 2, 0), (50, 2.0, 0)]:
        with pytest.raises(InvalidArgumentError):
            check_tier_options(str(tmp_path), *bad)
