"""A failed restore leaves nothing behind: its buffers are freed as soon as the caller lets go of
the error (no garbage collection needed), and asyncio reports no unretrieved exceptions."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch
from _snapshots import flip_byte, piece_of

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ChecksumMismatchError, SnapshotkitError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _foreign_storage

_foreign_storage.register()

_MIB = 1 << 20
_TENSOR_BYTES = 64 * _MIB


@pytest.fixture
def gc_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _corrupt_snapshot(tmp_path: Path) -> str:
    """A snapshot of one 64 MiB tensor whose last byte is flipped."""
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"s": StateDict(w=torch.ones(_TENSOR_BYTES // 4))})
    data_object, _, end = piece_of(path, "s/w")
    flip_byte(data_object, end - 1)
    return str(path)


def _fails(call: Callable[[], object]) -> None:
    """Run ``call``, expecting a snapshotkit error, and keep no reference to it."""
    try:
        call()
    except SnapshotkitError:
        pass
    else:  # pragma: no cover - the test's premise
        raise AssertionError("expected the restore to fail")


def _rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.mark.usefixtures("gc_off")
def test_failed_restores_free_their_buffers_without_a_garbage_collection(tmp_path: Path) -> None:
    # Before: each failed restore kept its destination (and bounce buffers) alive through
    # reference cycles between the error's traceback and the frames holding them: 221 -> 3,293
    # MiB RSS after three failed restores of a large snapshot, until gc ran.
    path = _corrupt_snapshot(tmp_path)
    with pytest.raises(ChecksumMismatchError):  # the premise: reading it fails
        Snapshot(path).read_object("s/w")
    before = _rss_bytes()
    for _ in range(3):
        # A destination of another shape: the restore loads into a fresh 64 MiB tensor.
        _fails(lambda: Snapshot(path).restore({"s": StateDict(w=torch.zeros(1))}, strict=False))
        _fails(lambda: Snapshot(path).read_object("s/w"))
    grown = _rss_bytes() - before
    assert grown < _TENSOR_BYTES, f"RSS grew by {grown / _MIB:.0f} MiB over 6 failed restores"


@pytest.mark.slow
@pytest.mark.parametrize("fail", ["checksum", "data-read"])
def test_failed_restores_report_no_unretrieved_asyncio_exceptions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    # Before: failing restores printed "Future exception was never retrieved" tracebacks.
    path = tmp_path / "snap"
    # Many data objects, so several reads are in flight when the first one fails.
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(1 << 20))
    Snapshot.take(str(path), {"s": StateDict(**{f"t{i}": torch.full((1 << 18,), i) for i in range(16)})})
    monkeypatch.delenv("SNAPSHOTKIT_DATA_OBJECT_BYTES")
    uri = str(path)
    options: dict[str, str] = {}
    if fail == "checksum":
        for i in range(16):
            data_object, start, _ = piece_of(path, f"s/t{i}")
            flip_byte(data_object, start)
    else:
        uri, options = f"foreign://{path}", {"fail": "data-read", "error": "ConnectionResetError"}
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):
            _fails(lambda: Snapshot(uri, storage_options=options).restore({"s": StateDict()}))
        gc.collect()  # unretrieved exceptions are reported when their futures are collected
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert noise == []
