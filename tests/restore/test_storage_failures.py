"""A storage plugin's own exceptions on the restore side: every one becomes a ``StorageError`` that
names the location and the logical paths involved, with the plugin's exception as its cause."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import MANIFEST, files_of, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import IncompleteSnapshotError, InvalidArgumentError, StorageError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _foreign_storage
from _foreign_storage import FAST_RETRY, FOREIGN_ERRORS, cause_names

_foreign_storage.register()


def _foreign(path: Path, fail: str, error: str) -> Snapshot:
    return Snapshot(f"foreign://{path}", storage_options={"fail": fail, "error": error, "retry": FAST_RETRY})


def _assert_wrapped(exc: BaseException, error: str, *words: str) -> None:
    assert isinstance(exc, StorageError), f"{type(exc).__name__}: {exc}"
    assert error in cause_names(exc), repr(exc.__cause__)
    message = str(exc)
    for word in (f"injected {error}", *words):
        assert word in message, f"{word!r} not in: {message}"
    assert "retry" in message  # says what to do


@pytest.mark.parametrize("error", FOREIGN_ERRORS)
def test_manifest_read_failures_are_storage_errors(tmp_path: Path, error: str) -> None:
    take_basic(tmp_path / "snap")
    for use in (lambda s: s.metadata, lambda s: s.get_manifest()):
        with pytest.raises(StorageError) as info:
            use(_foreign(tmp_path / "snap", "manifest-read", error))
        _assert_wrapped(info.value, error, f"'{MANIFEST}'", str(tmp_path / "snap"))
    with pytest.raises(StorageError) as info:
        _foreign(tmp_path / "snap", "manifest-read", error).read_object("extras/w")
    _assert_wrapped(info.value, error, "'extras/w'", f"'{MANIFEST}'")


@pytest.mark.parametrize("error", FOREIGN_ERRORS)
def test_data_read_failures_of_restore_and_read_object_name_the_logical_paths(tmp_path: Path, error: str) -> None:
    take_basic(tmp_path / "snap")
    location = Snapshot(str(tmp_path / "snap")).get_manifest()["0/extras/w"].pieces[0].location
    extras = StateDict(step=0, w=torch.zeros(8), name="", history=[])
    with pytest.raises(StorageError) as info:
        _foreign(tmp_path / "snap", "data-read", error).restore({"extras": extras})
    _assert_wrapped(info.value, error, "'extras/w'", f"'{location}'")
    with pytest.raises(StorageError) as info:
        _foreign(tmp_path / "snap", "data-read", error).read_object("extras/w")
    _assert_wrapped(info.value, error, "'extras/w'", f"'{location}'")


@pytest.mark.parametrize("error", FOREIGN_ERRORS)
def test_listing_failure_while_explaining_a_missing_manifest_is_a_storage_error(tmp_path: Path, error: str) -> None:
    take_basic(tmp_path / "snap")
    (tmp_path / "snap" / MANIFEST).unlink()
    with pytest.raises(StorageError) as info:
        _foreign(tmp_path / "snap", "list", error).restore({"extras": StateDict()})
    _assert_wrapped(info.value, error, "'extras'")


def test_incomplete_snapshot_error_names_the_logical_paths_asked_for(tmp_path: Path) -> None:
    take_basic(tmp_path / "snap")
    (tmp_path / "snap" / MANIFEST).unlink()
    with pytest.raises(IncompleteSnapshotError, match=r"'extras/w'.*data/"):
        Snapshot(str(tmp_path / "snap")).read_object("extras/w")
    with pytest.raises(IncompleteSnapshotError, match="'extras', 'model'"):
        Snapshot(str(tmp_path / "snap")).restore({"model": StateDict(), "extras": StateDict()})


def test_unsafe_location_error_names_the_logical_path(tmp_path: Path) -> None:
    from _snapshots import load_manifest_json, write_manifest_json

    from snapshotkit.errors import UnsafeLocationError

    take_basic(tmp_path / "snap")
    document = load_manifest_json(tmp_path / "snap")
    document["manifest"]["0/extras/w"]["pieces"][0]["location"] = "../outside"
    write_manifest_json(tmp_path / "snap", document)
    with pytest.raises(UnsafeLocationError, match="'0/extras/w'"):
        Snapshot(str(tmp_path / "snap")).get_manifest()


@pytest.mark.parametrize("logical_path", [None, 3, b"extras/w", ["extras/w"]])
def test_read_object_of_a_logical_path_that_is_not_a_str_is_a_type_error(tmp_path: Path, logical_path: Any) -> None:
    take_basic(tmp_path / "snap")
    with pytest.raises(InvalidArgumentError, match="logical path as a str") as info:
        Snapshot(str(tmp_path / "snap")).read_object(logical_path)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("error", ["TypeError", "NotImplementedError", "OSError"])
def test_storage_that_cannot_be_opened_is_a_storage_error(tmp_path: Path, error: str) -> None:
    take_basic(tmp_path / "snap")
    before = files_of(tmp_path / "snap")
    for use in (lambda s: s.metadata, lambda s: s.read_object("extras/w")):
        with pytest.raises(StorageError, match="cannot open the storage") as info:
            use(_foreign(tmp_path / "snap", "open", error))
        assert type(info.value.__cause__).__name__ == error
    assert files_of(tmp_path / "snap") == before


# fsspec's FTPFileSystem.__del__ fails on an instance whose __init__ raised: not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("uri", ["http://127.0.0.1:9/snap", "ftp://127.0.0.1:9/snap"])
def test_fsspec_schemes_that_fail_raise_storage_errors(uri: str) -> None:
    # Before: http:// raised a raw NotImplementedError (or aiohttp's error), ftp:// a TypeError.
    pytest.importorskip("fsspec")
    for use in (lambda s: s.metadata, lambda s: s.read_object("extras/w")):
        with pytest.raises(StorageError, match=r"127\.0\.0\.1:9") as info:
            use(Snapshot(uri))
        assert info.value.__cause__ is not None
