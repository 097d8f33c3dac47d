"""The local filesystem plugin: the fast path.

Writes are ``writev`` of the caller's buffers followed by ``fdatasync``; reads are ``preadv``
straight into caller memory. The commit marker is written to a temporary name, synced, and
hard-linked into place, which fails if the name exists, so two takes can never both commit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from snapshotkit._runtime.loop import to_thread
from snapshotkit.storage._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 1024
#: Largest single write/read syscall (Linux caps one call at just under 2 GiB).
_MAX_SYSCALL_BYTES = 1 << 30


def _next_batch(pending: list[memoryview]) -> list[memoryview]:
    """The buffers one vectored syscall takes: at most IOV_MAX of them and about 1 GiB."""
    batch: list[memoryview] = []
    batch_bytes = 0
    for buffer in pending[:_IOV_MAX]:
        if batch and batch_bytes + buffer.nbytes > _MAX_SYSCALL_BYTES:
            break
        batch.append(buffer)
        batch_bytes += buffer.nbytes
    return batch


def _advance(pending: list[memoryview], done: int) -> list[memoryview]:
    """Drop ``done`` bytes from the front of ``pending``; a partial syscall leaves one buffer's tail."""
    consumed = 0
    while consumed < len(pending) and done >= pending[consumed].nbytes:
        done -= pending[consumed].nbytes
        consumed += 1
    rest = pending[consumed:]
    if done:
        rest[0] = rest[0][done:]
    return rest


def _writev_all(fd: int, buffers: list[memoryview]) -> None:
    pending = [b for b in buffers if b.nbytes]
    while pending:
        pending = _advance(pending, os.writev(fd, _next_batch(pending)))


def _preadv_all(fd: int, start: int, buffers: Sequence[memoryview], location: str) -> None:
    pending = [b.cast("B") if b.format != "B" else b for b in buffers if b.nbytes]
    offset = start
    while pending:
        got = os.preadv(fd, _next_batch(pending), offset)
        if got == 0:
            remaining = sum(b.nbytes for b in pending)
            raise EOFError(
                f"{location}: object ends at byte {offset}, but {remaining} more bytes were expected "
                f"(read started at {start}); the data object is truncated"
            )
        offset += got
        pending = _advance(pending, got)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse directory fsync
        pass
    finally:
        os.close(fd)


class FSStoragePlugin(StoragePlugin):
    """Snapshot objects as files below a root directory."""

    capabilities = Capabilities(atomic_exclusive_write=True, listing=True, zero_copy_read_into=True)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._known_dirs: set[Path] = set()
        self._created_dirs: set[Path] = set()

    def _path(self, location: str) -> Path:
        return self.root / location

    def _ensure_parent(self, path: Path) -> None:
        parent = path.parent
        if parent not in self._known_dirs:
            missing = [p for p in (parent, *parent.parents) if not p.exists()]
            parent.mkdir(parents=True, exist_ok=True)
            self._created_dirs.update(missing)
            self._known_dirs.add(parent)

    def _write_blocking(self, path: Path, buffers: list[memoryview]) -> None:
        self._ensure_parent(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            _writev_all(fd, buffers)
            (getattr(os, "fdatasync", None) or os.fsync)(fd)
        finally:
            os.close(fd)

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_blocking, self._path(location), as_buffers(data))

    def _open_object(self, location: str) -> tuple[int, int]:
        """``(fd, size)`` of the regular file behind ``location``; anything else is "no such object"."""
        path = self._path(location)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except (NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(errno.ENOENT, "no such object", str(path)) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a directory: a prefix of objects, not an object
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "no such object", str(path))
        return fd, info.st_size

    @staticmethod
    def _check_range(location: str, start: int, end: int, size: int) -> None:
        if end > size:
            raise EOFError(f"{location}: range [{start}, {end}) reaches past the end of the object ({size} bytes)")

    def _read_blocking(self, location: str, byte_range: ByteRange | None) -> bytes | memoryview:
        fd, size = self._open_object(location)
        try:
            start, end = (0, size) if byte_range is None else (byte_range.start, byte_range.end)
            self._check_range(location, start, end, size)
            out = bytearray(end - start)
            _preadv_all(fd, start, [memoryview(out)], location)
            return memoryview(out)
        finally:
            os.close(fd)

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        result: bytes | memoryview = await to_thread(self._read_blocking, location, byte_range)
        return result

    def _read_into_blocking(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        fd, size = self._open_object(location)
        try:
            self._check_range(location, start, start + sum(b.nbytes for b in buffers), size)
            _preadv_all(fd, start, buffers, location)
        finally:
            os.close(fd)

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        await to_thread(self._read_into_blocking, location, start, buffers)

    async def exists(self, location: str) -> bool:
        return bool(await to_thread(self._path(location).is_file))

    def _write_exclusive_blocking(self, location: str, buffers: list[memoryview]) -> None:
        final = self._path(location)
        temporary = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex}")
        self._write_blocking(temporary, buffers)
        try:
            # Directory entries of every object written so far (and of every directory this plugin
            # created, in its parent) must be durable before the marker.
            directories = self._known_dirs | {final.parent} | {d.parent for d in self._created_dirs}
            for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
                _fsync_dir(directory)
            try:
                os.link(temporary, final)
            except OSError as exc:
                if exc.errno == errno.EEXIST:
                    raise FileExistsError(errno.EEXIST, "object exists", str(final)) from None
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                # No hard links here (some FUSE/network filesystems): best effort, check then rename.
                if final.exists():
                    raise FileExistsError(errno.EEXIST, "object exists", str(final)) from None
                os.rename(temporary, final)
            _fsync_dir(final.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_exclusive_blocking, location, as_buffers(data))

    def _delete_blocking(self, location: str) -> None:
        path = self._path(location)
        try:
            os.unlink(path)
        except (NotADirectoryError, IsADirectoryError, PermissionError) as exc:
            if isinstance(exc, PermissionError) and not path.is_dir():
                raise
            raise FileNotFoundError(errno.ENOENT, "no such object", str(path)) from None

    async def delete(self, location: str) -> None:
        await to_thread(self._delete_blocking, location)

    def _list_blocking(self, prefix: str) -> list[str]:
        base = self.root
        if not base.is_dir():
            return []
        found = []
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                relative = Path(dirpath, name).relative_to(base).as_posix()
                if relative.startswith(prefix):
                    found.append(relative)
        return sorted(found)

    async def list(self, prefix: str = "") -> list[str]:
        result: list[str] = await to_thread(self._list_blocking, prefix)
        return result

    def _remove_empty_dirs(self) -> None:
        for directory in sorted(self._created_dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()

    async def delete_prefix(self, prefix: str) -> None:
        await super().delete_prefix(prefix)
        await to_thread(self._remove_empty_dirs)

    async def discard(self, locations: Sequence[str]) -> None:
        await super().discard(locations)
        await to_thread(self._remove_empty_dirs)

    async def close(self) -> None:
        return None
