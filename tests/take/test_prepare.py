"""``snapshotkit._take.prepare``: a take refuses a destination that already holds a snapshot or a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import files_of, make_app_state, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import SnapshotExistsError, SnapshotkitError

pytestmark = pytest.mark.usefixtures("clean_env")


def test_take_onto_existing_snapshot_raises_and_overwrites_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    other = {"extras": StateDict(w=torch.ones(1000), step=99)}

    with pytest.raises(SnapshotExistsError) as info:
        Snapshot.take(str(path), other)

    assert isinstance(info.value, FileExistsError)
    message = str(info.value)
    assert str(path) in message
    assert "never overwrites" in message
    assert "new path" in message
    assert files_of(path) == before


def test_take_onto_existing_snapshot_through_file_uri_raises(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    with pytest.raises(SnapshotExistsError):
        Snapshot.take(f"file://{path}", make_app_state())
    assert files_of(path) == before


def test_take_onto_regular_file_raises_snapshotkit_error_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a snapshot")
    with pytest.raises(SnapshotkitError) as info:
        take_basic(path)
    assert isinstance(info.value, OSError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b"not a snapshot"
