"""A storage plugin's own exceptions on the take side (``take``, ``async_take`` with both
executors): every one becomes a ``StorageError`` that names the location and the logical paths
involved, with the plugin's exception as its cause, and nothing is left behind."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import MANIFEST, assert_nothing_committed

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import StorageError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _foreign_storage
from _foreign_storage import FAST_RETRY, FOREIGN_ERRORS, cause_names

_foreign_storage.register()
pytestmark = pytest.mark.timeout(120)


def _app_state() -> dict[str, Any]:
    return {"s": StateDict(w=torch.arange(1000, dtype=torch.float32), step=7)}


def _take(path: Path, fail: str, error: str, how: str) -> None:
    options = {"fail": fail, "error": error, "retry": FAST_RETRY}
    if how == "take":
        Snapshot.take(f"foreign://{path}", _app_state(), storage_options=options)
    else:
        Snapshot.async_take(f"foreign://{path}", _app_state(), storage_options=options, executor=how).wait()


def _assert_wrapped(exc: BaseException, error: str, *words: str) -> None:
    assert isinstance(exc, StorageError), f"{type(exc).__name__}: {exc}"
    # From the checkpoint daemon the chain arrives pickled, without causes; the text still names it.
    assert error in cause_names(exc) or f"{error}: injected" in str(exc.__cause__), repr(exc.__cause__)
    message = str(exc)
    for word in (f"injected {error}", "Nothing was committed", *words):
        assert word in message, f"{word!r} not in: {message}"


@pytest.mark.parametrize("error", FOREIGN_ERRORS)
@pytest.mark.parametrize("how", ["take", "thread", "process"])
def test_data_write_failures_name_the_location_and_logical_paths(tmp_path: Path, error: str, how: str) -> None:
    with pytest.raises(StorageError) as info:
        _take(tmp_path / "snap", "data-write", error, how)
    _assert_wrapped(info.value, error, "'data/", "'s/w'", str(tmp_path / "snap"))
    assert_nothing_committed(tmp_path / "snap")


@pytest.mark.parametrize("error", FOREIGN_ERRORS)
@pytest.mark.parametrize("how", ["take", "thread"])
def test_existence_check_and_manifest_write_failures_are_storage_errors(tmp_path: Path, error: str, how: str) -> None:
    for fail in ("exists", "manifest-write"):
        with pytest.raises(StorageError) as info:
            _take(tmp_path / "snap", fail, error, how)
        _assert_wrapped(info.value, error, f"'{MANIFEST}'", str(tmp_path / "snap"))
        assert_nothing_committed(tmp_path / "snap")


@pytest.mark.parametrize("error", ["TypeError", "NotImplementedError"])
def test_storage_that_cannot_be_opened_is_a_storage_error_before_anything_is_written(
    tmp_path: Path, error: str
) -> None:
    with pytest.raises(StorageError, match="opening the storage") as info:
        _take(tmp_path / "snap", "open", error, "take")
    assert type(info.value.__cause__).__name__ == error
    assert not (tmp_path / "snap").exists()


# fsspec's FTPFileSystem.__del__ fails on an instance whose __init__ raised: not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("uri", ["http://127.0.0.1:9/snap", "ftp://127.0.0.1:9/snap"])
def test_fsspec_schemes_that_fail_raise_storage_errors(uri: str) -> None:
    # Before: http:// raised a raw NotImplementedError (or aiohttp's error), ftp:// a TypeError.
    pytest.importorskip("fsspec")
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:9") as info:
        Snapshot.take(uri, _app_state())
    assert info.value.__cause__ is not None
