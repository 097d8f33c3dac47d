"""Which restore failures make restore_latest move on (``_lifecycle/fallback.py``)."""

from __future__ import annotations

import pytest

from snapshotkit._lifecycle.fallback import reason, skip_agreed, verdict
from snapshotkit.errors import (
    ChecksumMismatchError,
    IncompleteSnapshotError,
    ManifestIntegrityError,
    RankFailedError,
    StateMismatchError,
    StorageError,
    UnsafeStorageObjectError,
    UnsupportedFormatVersionError,
)


def from_other_rank(cause: BaseException | None) -> RankFailedError:
    error = RankFailedError("restore: rank 1 failed", 1)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ChecksumMismatchError("x"), "skip"),
        (ManifestIntegrityError("x"), "skip"),
        (IncompleteSnapshotError("x"), "skip"),
        (UnsafeStorageObjectError("x"), "skip"),
        (UnsupportedFormatVersionError("x"), "raise"),
        (StateMismatchError("x"), "raise"),
        (StorageError("x"), "raise"),
        (from_other_rank(ChecksumMismatchError("x")), "skip"),
        (from_other_rank(StateMismatchError("x")), "raise"),
        (from_other_rank(None), "follow"),
    ],
)
def test_verdicts(exc: BaseException, expected: str) -> None:
    assert verdict(exc) == expected


def test_ranks_skip_only_when_nobody_raises() -> None:
    assert skip_agreed(["skip", "follow"])
    assert not skip_agreed(["skip", "raise"])
    assert not skip_agreed(["follow", "follow"])


def test_the_reason_names_the_failing_ranks_error() -> None:
    assert reason(from_other_rank(ChecksumMismatchError("piece 3"))) == "ChecksumMismatchError: piece 3"
