"""The local filesystem plugin: the fast path.

Writes are ``writev`` of the caller's buffers followed by ``fdatasync``; reads are ``preadv``
straight into caller memory. The commit marker is written to a temporary name, synced, and
hard-linked into place, which fails if the name exists, so two takes can never both commit.

Durability: ``write`` returns once the file is synced and so is its directory (the entry that
names it), and every directory it created is synced in its parent, shallowest first. So by the
time the commit marker is linked, every data file and every directory that gained an entry is
durable; the marker's directory is synced after the link. A failed commit leaves no temporary
file behind.

Reads open only regular files inside the root: a location that resolves (through symlinks)
outside the root, or names a FIFO, socket or device, raises
:class:`~snapshotkit.errors.UnsafeStorageObjectError`; objects are opened non-blocking, so no
open can hang.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import operator
import os
import stat
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from snapshotkit._runtime.loop import to_thread
from snapshotkit.errors import UnsafeStorageObjectError
from snapshotkit.storage._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 1024
#: Largest single write/read syscall (Linux caps one call at just under 2 GiB).
_MAX_SYSCALL_BYTES = 1 << 30


_NBYTES = operator.attrgetter("nbytes")

#: Bytes of one read-ahead hint to the kernel (:meth:`FSStoragePlugin.prefetch`).
_PREFETCH_CHUNK_BYTES = 2 << 20


def _next_batch(pending: list[memoryview]) -> tuple[list[memoryview], int]:
    """The buffers one vectored syscall takes (at most IOV_MAX of them and about 1 GiB), and their bytes."""
    batch = pending[:_IOV_MAX]
    batch_bytes = sum(map(_NBYTES, batch))
    if batch_bytes <= _MAX_SYSCALL_BYTES:  # the common case: the first IOV_MAX buffers, summed in C
        return batch, batch_bytes
    batch, batch_bytes = [], 0
    for buffer in pending[:_IOV_MAX]:
        if batch and batch_bytes + buffer.nbytes > _MAX_SYSCALL_BYTES:
            break
        batch.append(buffer)
        batch_bytes += buffer.nbytes
    return batch, batch_bytes


def _advance(pending: list[memoryview], done: int, batch: tuple[list[memoryview], int]) -> list[memoryview]:
    """Drop ``done`` bytes from the front of ``pending`` after a syscall on ``batch`` (its buffers
    and bytes, :func:`_next_batch`); a partial syscall leaves one buffer's tail."""
    if done == batch[1]:  # the common case: the whole batch
        return pending[len(batch[0]) :]
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
        batch = _next_batch(pending)
        pending = _advance(pending, os.writev(fd, batch[0]), batch)


def _preadv_all(fd: int, start: int, buffers: Sequence[memoryview], location: str) -> None:
    pending = [b.cast("B") if b.format != "B" else b for b in buffers if b.nbytes]
    offset = start
    while pending:
        batch = _next_batch(pending)
        got = os.preadv(fd, batch[0], offset)
        if got == 0:
            remaining = sum(b.nbytes for b in pending)
            raise EOFError(
                f"{location}: object ends at byte {offset}, but {remaining} more bytes were expected "
                f"(read started at {start}); the data object is truncated"
            )
        offset += got
        pending = _advance(pending, got, batch)


#: What a file system that cannot fsync a directory answers: nothing to make durable there.
_DIR_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR})


def _fsync_dir(path: Path) -> None:
    """Make ``path``'s entries durable. A file system that refuses directory fsync is skipped;
    any other failure (``EIO``: the entries may not survive a crash) is raised."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device")):
        if test(mode):
            return name
    return "a block device" if stat.S_ISBLK(mode) else "not a regular file"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _opened_path(fd: int) -> str | None:
    """The path the kernel resolved ``fd`` to (Linux), or None where that cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # pragma: no cover - no /proc
        return None


class FSStoragePlugin(StoragePlugin):
    """Snapshot objects as files below a root directory."""

    capabilities = Capabilities(
        atomic_exclusive_write=True,
        atomic_replace=True,
        listing=True,
        zero_copy_read_into=True,
        directories=True,
        host_page_cache=True,
    )

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
            # A new directory's entry is durable once its parent is synced: shallowest first.
            for directory in reversed(missing):
                _fsync_dir(directory.parent)
            self._created_dirs.update(missing)
            self._known_dirs.add(parent)

    def _create(self, path: Path) -> int:
        """Open ``path`` for a fresh write, its directories made first."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._ensure_parent(path)
        try:
            return os.open(path, flags, 0o644)
        except FileNotFoundError:
            # The directory went away since this plugin made it (a plugin reused across takes,
            # as the checkpoint daemon's is, and the snapshot there deleted in between): make it again.
            self._known_dirs.discard(path.parent)
            self._ensure_parent(path)
            return os.open(path, flags, 0o644)

    def _write_blocking(self, path: Path, buffers: list[memoryview], *, sync_entry: bool = True) -> None:
        """Write and sync ``path``; with ``sync_entry``, sync its directory too (its name is durable)."""
        try:
            fd = self._create(path)
            try:
                _writev_all(fd, buffers)
                (getattr(os, "fdatasync", None) or os.fsync)(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, str(path)) from exc  # name the file
        if sync_entry:
            _fsync_dir(path.parent)

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_blocking, self._path(location), as_buffers(data))

    def _refuse(self, path: Path, why: str) -> UnsafeStorageObjectError:
        return UnsafeStorageObjectError(
            f"refusing to read {str(path)!r}: {why}. Snapshots hold only regular files inside their "
            "directory, so this one was altered (or is not a snapshot); restore from another snapshot"
        )

    def _open_object(self, location: str) -> tuple[int, int]:
        """``(fd, size)`` of the regular file behind ``location``.

        A directory is "no such object" (a prefix of objects); a location that resolves outside
        the root, or a FIFO, socket or device, is refused. The open is non-blocking (a FIFO
        without a writer would otherwise block it forever) and its resolved path is checked
        again after opening, so a symlink swapped in meanwhile cannot lead out.
        """
        path = self._path(location)
        root = os.path.realpath(self.root)
        resolved = os.path.realpath(path)
        if not _inside(resolved, root):
            raise self._refuse(path, f"it resolves to {resolved!r}, outside the snapshot root {root!r}")
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(path, flags)
        except (NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(errno.ENOENT, "no such object", str(path)) from None
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: a socket, or a device with nothing behind it
                raise
            raise self._refuse(path, "it is a socket or device, not a regular file") from exc
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):  # a prefix of objects, not an object
                raise FileNotFoundError(errno.ENOENT, "no such object", str(path))
            if not stat.S_ISREG(info.st_mode):
                raise self._refuse(path, f"it is {_kind(info.st_mode)}, not a regular file")
            opened = _opened_path(fd)
            if opened is not None and not _inside(opened, root):
                raise self._refuse(path, f"it resolves to {opened!r}, outside the snapshot root {root!r}")
        except BaseException:
            os.close(fd)
            raise
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

    def _prefetch_blocking(self, location: str, byte_range: ByteRange) -> None:
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or byte_range.length == 0:  # not on this platform: reads stay as they are
            return
        try:
            fd, _ = self._open_object(location)
        except (OSError, UnsafeStorageObjectError):  # the read that follows says what is wrong
            return
        try:
            # one call per chunk: Linux reads ahead at most about its read-ahead window per call
            for start in range(byte_range.start, byte_range.end, _PREFETCH_CHUNK_BYTES):
                advise(fd, start, min(_PREFETCH_CHUNK_BYTES, byte_range.end - start), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # a hint the kernel declined
        finally:
            os.close(fd)

    async def prefetch(self, location: str, byte_range: ByteRange) -> None:
        """Ask the kernel to read ``byte_range`` into the page cache (``POSIX_FADV_WILLNEED``);
        it starts the reads and returns without waiting for them."""
        await to_thread(self._prefetch_blocking, location, byte_range)

    async def exists(self, location: str) -> bool:
        return bool(await to_thread(self._path(location).is_file))

    def _write_exclusive_blocking(self, location: str, buffers: list[memoryview]) -> None:
        final = self._path(location)
        temporary = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex}")
        # IMPORTANT: every data file, its directory and every directory created on the way were
        # synced by the write that made them (_write_blocking), so all the marker points at is
        # durable before it is linked. Any failure removes the temporary file.
        try:
            self._write_blocking(temporary, buffers, sync_entry=False)
            self._link_exclusive(temporary, final)
            with contextlib.suppress(FileNotFoundError):  # renamed into place where links fail
                os.unlink(temporary)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _fsync_dir(final.parent)  # the marker's entry (and the temporary's removal)

    @staticmethod
    def _link_exclusive(temporary: Path, final: Path) -> None:
        """Give ``temporary``'s file the name ``final``, or raise ``FileExistsError`` if it is taken."""
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

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_exclusive_blocking, location, as_buffers(data))

    def _replace_blocking(self, location: str, buffers: list[memoryview]) -> None:
        final = self._path(location)
        temporary = final.with_name(f"{final.name}.tmp-{uuid.uuid4().hex}")
        # A temporary file written and synced, then renamed over the object: rename(2) is atomic,
        # so a reader (and a crash at any instant) sees the old file whole or the new one whole.
        try:
            self._write_blocking(temporary, buffers, sync_entry=False)
            os.replace(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _fsync_dir(final.parent)  # the new entry

    async def replace(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._replace_blocking, location, as_buffers(data))

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

    def _list_dirs_blocking(self, prefix: str) -> builtins.list[str]:
        top = self.root / prefix if prefix else self.root
        if top.is_symlink() or not top.is_dir():
            return []
        with os.scandir(top) as entries:
            return sorted(prefix + e.name for e in entries if e.is_dir(follow_symlinks=False))

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The directories directly below ``prefix``, empty ones included."""
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"list_dirs takes '' or a prefix ending in '/', got {prefix!r}")
        found: builtins.list[str] = await to_thread(self._list_dirs_blocking, prefix)
        return found

    def _remove_empty_dirs(self) -> None:
        for directory in sorted(self._created_dirs, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _remove_empty_dirs_blocking(self, prefix: str) -> None:
        if not prefix.endswith("/") or not prefix.strip("/"):
            raise ValueError(f"remove_empty_dirs takes a directory prefix ending in '/', got {prefix!r}")
        top = self.root / prefix.rstrip("/")
        if top.is_symlink() or not top.is_dir():
            return
        for dirpath, _dirnames, _filenames in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):  # not empty: it stays
                os.rmdir(dirpath)
        _fsync_dir(top.parent)

    async def remove_empty_dirs(self, prefix: str) -> None:
        await to_thread(self._remove_empty_dirs_blocking, prefix)

    async def delete_prefix(self, prefix: str) -> None:
        await super().delete_prefix(prefix)
        await to_thread(self._remove_empty_dirs)

    async def discard(self, locations: Sequence[str]) -> None:
        await super().discard(locations)
        await to_thread(self._remove_empty_dirs)

    async def close(self) -> None:
        return None
