"""``snapshotkit._storage_failure.wrap_storage_failure``: the one wrapper of a storage plugin's
exception, with each side's advice (``_take.commit.storage_error``, ``_restore.failures.storage_failure``).
The messages end to end are checked in ``tests/take/test_storage_failures.py`` and
``tests/restore/test_storage_failures.py``."""

from __future__ import annotations

import asyncio

import pytest

from snapshotkit._restore.failures import storage_failure
from snapshotkit._storage_failure import wrap_storage_failure
from snapshotkit._take.commit import storage_error
from snapshotkit.errors import (
    BucketNotFoundError,
    ChecksumMismatchError,
    StorageError,
    StoragePermissionError,
)


def test_a_plugin_error_becomes_a_storage_error_naming_where_and_what() -> None:
    cause = TimeoutError("read timed out")
    error = wrap_storage_failure(
        cause,
        action="reading",
        advice="Retry.",
        location="data/0_00000_ab",
        path="/ckpt/step_1",
        logical_paths=[f"m/{i}" for i in range(7)],
    )
    assert type(error) is StorageError
    assert error.__cause__ is cause
    assert str(error) == (
        "reading 'data/0_00000_ab' of the snapshot at '/ckpt/step_1' (holding 'm/0', 'm/1', 'm/2', 'm/3', 'm/4' "
        "and 2 more) failed: TimeoutError: read timed out. Retry."
    )


def test_where_without_a_location_or_a_path() -> None:
    cause = ConnectionResetError("reset")
    assert str(wrap_storage_failure(cause, action="opening", advice="A.", path="s3://b/p", whole="the storage")) == (
        "opening the storage at 's3://b/p' failed: ConnectionResetError: reset. A."
    )
    assert str(wrap_storage_failure(cause, action="listing", advice="A.", path="s3://b/p")) == (
        "listing the snapshot at 's3://b/p' failed: ConnectionResetError: reset. A."
    )
    alone = wrap_storage_failure(cause, action="reading", advice="A.", location="x")
    assert str(alone).startswith("reading 'x' failed")


def test_a_storage_error_keeps_its_class_and_gains_the_context() -> None:
    cause = StoragePermissionError("access denied")
    error = wrap_storage_failure(cause, action="writing", advice="A.", location="x", path="p")
    assert type(error) is StoragePermissionError
    assert error.__cause__ is cause
    assert str(error) == "writing 'x' of the snapshot at 'p' failed: access denied. A."
    assert isinstance(wrap_storage_failure(BucketNotFoundError("no bucket"), action="r", advice="A."), StorageError)


@pytest.mark.parametrize(
    "exc", [ChecksumMismatchError("bad bytes"), KeyboardInterrupt(), asyncio.CancelledError()], ids=type
)
def test_other_snapshotkit_errors_and_interrupts_pass_unchanged(exc: BaseException) -> None:
    assert wrap_storage_failure(exc, action="reading", advice="A.", location="x") is exc
    assert storage_error(exc, "p", location="x") is exc
    assert storage_failure(exc, location="x") is exc


def test_each_side_says_what_to_do_next() -> None:
    take = storage_error(OSError("disk full"), "/ckpt", location="data/0", logical_paths=["m/w"])
    assert str(take) == (
        "writing 'data/0' of the snapshot at '/ckpt' (holding 'm/w') failed: OSError: disk full. Nothing was "
        "committed; check the path, permissions and free space (and that the store is reachable), then take again"
    )
    assert str(storage_error(OSError("no"), "/ckpt", action="opening")).startswith("opening the storage at '/ckpt'")
    restore = storage_failure(OSError("gone"), location="data/0", logical_paths=["m/w"], path="/ckpt")
    assert str(restore) == (
        "reading 'data/0' of the snapshot at '/ckpt' (holding 'm/w') failed: OSError: gone. The snapshot itself "
        "is unchanged: check that the store is reachable and the credentials, then retry"
    )
