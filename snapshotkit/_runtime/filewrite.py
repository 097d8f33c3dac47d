"""Writing large files quickly and durably on a local file system.

What the export (:mod:`snapshotkit.convert`) and the local tier's copies (:mod:`snapshotkit._tier`)
both do: buffered writes in slices the page cache takes cheaply, blocks allocated up front, the
disk asked to start writing back as soon as bytes are written (so that the final ``fsync`` has
little left to wait for). Linux calls are reached through ``ctypes``; elsewhere they do nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["WRITE_SLICE_BYTES", "fsync_path", "preallocate", "pwrite_all", "start_writeback"]

#: The largest single write, ending at a multiple of this in the file (see :func:`pwrite_all`).
WRITE_SLICE_BYTES = 64 << 10


def pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of the file ``fd``, in slices that end at multiples of
    :data:`WRITE_SLICE_BYTES` in the file, as the kernel's own copy (``copy_file_range``, splice)
    writes: writes of several MiB into new page cache took up to 4x more kernel time on the
    benchmark machine (ext4 in a VM, docs/benchmarks.md "Export"), and the syscalls are cheap."""
    view = memoryview(data)
    while view.nbytes:
        length = min(view.nbytes, WRITE_SLICE_BYTES - offset % WRITE_SLICE_BYTES)
        written = os.pwrite(fd, view[:length], offset)
        view, offset = view[written:], offset + written


def _libc(name: str, *argtypes: Any) -> Any:
    """The Linux libc function ``name`` (returning a C int), or None elsewhere or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


_sync_file_range = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_fallocate = _libc("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int = 0, nbytes: int = 0) -> None:
    """Start writing back the file's dirty pages in ``[offset, offset + nbytes)`` (``nbytes`` 0:
    to the end) without waiting for it (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; errors
    surface at the final ``fsync``, which is still needed: this makes nothing durable)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def fsync_path(path: Path) -> None:
    """Make ``path`` (a file, or a directory's entries) durable; a failure is raised."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def preallocate(fd: int, size_bytes: int) -> None:
    """Give the file its blocks and size up front where the file system can (Linux ``fallocate``;
    never glibc's emulation, which writes zeros): buffered writes into allocated blocks cost
    noticeably less kernel time than into a growing file (docs/benchmarks.md "Export")."""
    if _fallocate is not None and size_bytes > 0:
        _fallocate(fd, 0, 0, size_bytes)  # refused (EOPNOTSUPP...): the writes allocate as they go
