"""Opening a snapshot (``snapshotkit._restore.metadata.load_metadata``): nothing there, a file, or a take
that never committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import MANIFEST, data_objects, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import IncompleteSnapshotError, SnapshotNotFoundError

pytestmark = pytest.mark.usefixtures("clean_env")


def test_open_missing_path_raises_snapshot_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nothing-here"
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert type(exc) is SnapshotNotFoundError  # not IncompleteSnapshotError: nothing is there
    assert isinstance(exc, FileNotFoundError)
    assert str(path) in str(exc)
    assert "check the path" in str(exc)
    assert not path.exists()


def test_open_empty_directory_raises_snapshot_not_found(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(tmp_path)).metadata
    assert type(info.value) is SnapshotNotFoundError


def test_restore_and_read_object_of_missing_path_raise_snapshot_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nothing-here"
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).restore({"extras": StateDict()})
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).read_object("extras/step")


def test_open_regular_file_raises_snapshot_not_found(tmp_path: Path) -> None:
    # A common slip: passing a torch.save file where a snapshot directory is expected.
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(path)).metadata
    assert isinstance(info.value, FileNotFoundError)
    assert str(path) in str(info.value)


def test_open_interrupted_take_raises_incomplete_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    (path / MANIFEST).unlink()  # what a take killed before its commit leaves behind
    assert data_objects(path)

    with pytest.raises(IncompleteSnapshotError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, SnapshotNotFoundError)
    assert isinstance(exc, FileNotFoundError)
    message = str(exc)
    assert str(path) in message
    assert "never committed" in message
    assert "earlier snapshot" in message
    assert "delete this path" not in message


def test_open_directory_of_unknown_files_never_advises_deleting(tmp_path: Path) -> None:
    # Not a take's leftovers: someone's files. Say what is there; never suggest deleting it.
    (tmp_path / "notes.txt").write_text("my data")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "table.csv").write_text("a,b")
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(tmp_path)).metadata
    assert type(info.value) is SnapshotNotFoundError
    message = str(info.value)
    assert "'notes.txt'" in message
    assert "not a snapshot" in message
    assert "check the path" in message.lower()
    assert "snapshotkit import" in message
    assert "delete" not in message.lower()
    assert "never committed" not in message


def test_open_take_leftovers_mixed_with_other_files_never_advises_deleting(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    (path / MANIFEST).unlink()
    (path / "README").write_text("mine")
    with pytest.raises(IncompleteSnapshotError) as info:
        _ = Snapshot(str(path)).metadata
    message = str(info.value)
    assert "never committed" in message
    assert "'README'" in message
    assert "delete" not in message.lower()
