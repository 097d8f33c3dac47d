"""Errors for paths that hold no snapshot say what is there and the one thing to do next; none
suggests deleting anything."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import snapshotkit
from snapshotkit import Snapshot, StateDict
from snapshotkit.cli import main
from snapshotkit.errors import (
    ForeignCheckpointError,
    IncompleteSnapshotError,
    SnapshotExistsError,
    SnapshotNotFoundError,
    StorageError,
    UnknownStorageSchemeError,
)
from snapshotkit.storage import _fsspec as fsspec_module

PACKAGE = Path(snapshotkit.__file__).parent
_DELETING = re.compile(r"\b(delete|remove|rm|erase)\b", re.IGNORECASE)


def _state() -> dict[str, StateDict]:
    return {"model": StateDict(w=torch.arange(6.0))}


def _error(path: str | Path) -> SnapshotNotFoundError:
    with pytest.raises(SnapshotNotFoundError) as info:
        Snapshot(str(path)).restore(_state())
    message = str(info.value)
    assert not _DELETING.search(message), message
    return info.value


def test_a_folder_of_managed_snapshots_is_named_with_its_steps_and_how_to_open_one(tmp_path: Path) -> None:
    for step in (20, 100, 3):
        Snapshot.take(str(tmp_path / f"step_{step}"), _state())
    error = _error(tmp_path)
    message = str(error)
    assert type(error) is SnapshotNotFoundError  # not "incomplete", not another library's
    assert "folder of 3 snapshots" in message
    assert "(step_3 ... step_100)" in message  # in step order, not string order
    assert repr(str(tmp_path / "step_100")) in message  # the latest, to open
    assert f"SnapshotManager({str(tmp_path)!r}).restore_latest(" in message
    assert "never committed" not in message and "written by snapshotkit" not in message


def test_a_folder_of_snapshots_not_named_by_steps_names_them_without_the_manager(tmp_path: Path) -> None:
    for name in ("best", "last"):
        Snapshot.take(str(tmp_path / "runs" / name), _state())
    message = str(_error(tmp_path))
    assert "folder of 2 snapshots (runs/best ... runs/last)" in message
    assert repr(str(tmp_path / "runs" / "last")) in message
    assert "SnapshotManager" not in message


_DCP_IN_ONE_PROCESS = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@_DCP_IN_ONE_PROCESS
def test_a_dcp_checkpoint_is_named_with_the_import_command(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    error = _error(tmp_path / "dcp")
    assert isinstance(error, ForeignCheckpointError) and error.source_format == "dcp"
    assert "DCP (torch.distributed.checkpoint) checkpoint" in str(error)
    assert f"snapshotkit import {tmp_path / 'dcp'} OUT --from dcp" in str(error)


@_DCP_IN_ONE_PROCESS
def test_a_folder_of_dcp_checkpoints_names_them_and_how_to_import_one(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    for step in (5, 10):
        dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(tmp_path / f"ckpt_{step}"), no_dist=True)
    error = _error(tmp_path)
    message = str(error)
    assert isinstance(error, ForeignCheckpointError) and error.source_format == "dcp"
    assert "folder of 2 subdirectories" in message and "(ckpt_5 ... ckpt_10;" in message
    assert f"snapshotkit import {tmp_path / 'ckpt_5'} OUT --from dcp" in message


def test_a_torch_save_file_is_named_with_the_import_command(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    error = _error(tmp_path / "model.pt")
    assert isinstance(error, ForeignCheckpointError) and error.source_format == "torch"
    assert f"snapshotkit import {tmp_path / 'model.pt'} OUT --from torch" in str(error)


def test_an_empty_directory_is_called_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    message = str(_error(tmp_path / "empty"))
    assert "is an empty directory" in message and "check the path" in message


def test_a_missing_path_says_so_and_suggests_a_close_sibling(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "step_1000"), _state())
    message = str(_error(tmp_path / "step_100"))
    assert "nothing exists there" in message
    assert f"did you mean {str(tmp_path / 'step_1000')!r}" in message
    assert "nor at its parent" in str(_error(tmp_path / "no" / "such"))
    unlike = str(_error(tmp_path / "zzz"))
    assert "nothing exists there" in unlike and "did you mean" not in unlike and "check the path" in unlike


def test_a_file_that_is_no_checkpoint_is_called_a_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    message = str(_error(tmp_path / "notes.txt"))
    assert "is a file, not a snapshot" in message and "open the snapshot's directory" in message


def test_a_snapshots_manifest_file_points_at_its_directory(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "snap"), _state())
    message = str(_error(tmp_path / "snap" / ".snapshot_metadata"))
    assert "manifest file" in message and repr(str(tmp_path / "snap")) in message


def test_a_take_that_never_committed_is_still_called_incomplete(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "snap"), _state())
    (tmp_path / "snap" / ".snapshot_metadata").unlink()
    error = _error(tmp_path / "snap")
    assert isinstance(error, IncompleteSnapshotError)
    assert "never committed" in str(error) and "Restore from an earlier snapshot" in str(error)


def test_an_unknown_scheme_with_fsspec_installed_says_fsspec_lacks_it(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(UnknownStorageSchemeError) as info:
        Snapshot("nosuchscheme://bucket/snap").metadata
    message = str(info.value)
    assert "fsspec (installed) has no implementation for 'nosuchscheme'" in message
    assert "pip install fsspec" not in message and "install fsspec" not in message
    assert "register_storage_plugin('nosuchscheme', factory)" in message


def test_a_misspelt_scheme_gets_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(UnknownStorageSchemeError, match=r"did you mean s3://"):
        Snapshot("s4://bucket/snap").metadata


def test_an_unknown_scheme_without_fsspec_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsspec_module, "fsspec_schemes", lambda: None)
    with pytest.raises(UnknownStorageSchemeError) as info:
        Snapshot("nosuchscheme://bucket/snap").metadata
    assert "fsspec, which serves many more, is not installed" in str(info.value)
    assert "pip install fsspec" in str(info.value)


def test_a_scheme_fsspec_knows_without_its_package_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = pytest.importorskip("fsspec.registry")
    fake = {"class": "snapshotkit_absent_pkg.FakeFileSystem", "err": "Install snapshotkit_absent_pkg to use skfake"}
    monkeypatch.setitem(registry.known_implementations, "skfake", fake)
    with pytest.raises(StorageError) as info:
        Snapshot("skfake://bucket/snap").metadata
    message = str(info.value)
    assert "fsspec serves the skfake:// scheme with snapshotkit_absent_pkg.FakeFileSystem" in message
    assert "Install snapshotkit_absent_pkg to use skfake" in message
    assert isinstance(info.value.__cause__, ImportError)


def test_a_take_onto_a_snapshot_says_to_choose_a_new_path_not_to_delete(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "snap"), _state())
    with pytest.raises(SnapshotExistsError) as info:
        Snapshot.take(str(tmp_path / "snap"), _state())
    assert "new path" in str(info.value) and not _DELETING.search(str(info.value))


def test_the_cli_says_what_a_run_folder_is(tmp_path: Path) -> None:
    for step in (1, 2):
        Snapshot.take(str(tmp_path / f"step_{step}"), _state())
    result = CliRunner().invoke(main, ["info", str(tmp_path)])
    assert result.exit_code == 2
    assert "folder of 2 snapshots (step_1 ... step_2)" in result.output


def _raised_texts(tree: ast.AST) -> list[tuple[int, str]]:
    """The string parts of every ``raise SomeError(...)`` message in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    found.append((node.lineno, sub.value))
    return found


# Messages that say "delete"/"remove" and were read: none of them advises deleting stored data.
_REVIEWED = {
    ("_format/user_metadata.py", "remove it or encode the text first"),  # a character of the user's metadata
    ("_restore/bases.py", "read-side storage does not delete"),  # describes a refused operation
    ("_restore/plan.py", "Remove it from app_state"),  # an app_state key, not stored data
    ("storage/_s3.py", "could not delete"),  # reports a failed delete the caller asked for
}


def _deleting(module: str, tree: ast.AST) -> list[str]:
    return [
        f"{module}:{line}: {text}"
        for line, text in _raised_texts(tree)
        if _DELETING.search(text) and not any(module == m and part in text for m, part in _REVIEWED)
    ]


def test_no_error_message_in_the_package_suggests_deleting_anything() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        offenders += _deleting(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
    assert offenders == [], "\n".join(offenders)


def test_the_deletion_check_finds_a_message_that_suggests_deleting() -> None:
    tree = ast.parse('raise ValueError(f"{path} exists; delete it first")')
    assert _deleting("convert/_export.py", tree) == ["convert/_export.py:1:  exists; delete it first"]


def test_messages_for_absent_snapshots_reach_the_path_users_gave(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "empty")
    assert repr(str(tmp_path / "empty")) in str(_error(tmp_path / "empty"))
