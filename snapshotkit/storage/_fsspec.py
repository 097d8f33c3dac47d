"""The generic fsspec plugin: any scheme fsspec knows (``local://``, ``ftp://``, ``sftp://``, ...).

A fallback for schemes with no dedicated plugin. It speaks fsspec's synchronous API on the
snapshotkit thread pool; writes stream the caller's buffers into one file without joining them.
``write_exclusive`` checks then writes, so the commit marker is exclusive only in the absence of
a concurrent writer (``capabilities.atomic_exclusive_write`` is False).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from snapshotkit._runtime.loop import to_thread
from snapshotkit.errors import BucketNotFoundError, StorageError, StoragePermissionError
from snapshotkit.storage._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

T = TypeVar("T")

#: Errors that are part of the plugin contract and pass through unchanged.
_CONTRACT_ERRORS = (FileNotFoundError, FileExistsError, EOFError, StorageError)


def fsspec_knows(scheme: str) -> bool:
    """Whether fsspec is installed and has an implementation registered for ``scheme``."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return False
    return scheme in known_implementations or scheme in registry


class FsspecStoragePlugin(StoragePlugin):
    """Objects as files of an fsspec filesystem below ``root``."""

    capabilities = Capabilities(listing=True)

    def __init__(
        self,
        protocol: str,
        root: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        filesystem: Any | None = None,
    ) -> None:
        """``filesystem``: an fsspec filesystem built by a subclass (then ``storage_options`` is unused)."""
        if filesystem is None:
            try:
                import fsspec
            except ImportError:  # pragma: no cover - the registry only routes here when fsspec imports
                raise StorageError(f"the {protocol!r} scheme needs fsspec: pip install fsspec") from None
            filesystem = fsspec.filesystem(protocol, **dict(storage_options or {}))
        self.protocol = protocol
        self.root = root.rstrip("/")
        self._fs = filesystem

    def _path(self, location: str) -> str:
        return f"{self.root}/{location}"

    def _map_error(self, exc: Exception, describe: str) -> BaseException | None:
        """The snapshotkit error for a backend failure, or None to let it propagate unchanged.

        Subclasses extend this with their backend's permission and availability errors.
        """
        if isinstance(exc, PermissionError):
            return StoragePermissionError(f"{describe}: permission denied ({exc}); check the credentials")
        return None

    async def _run(self, describe: str, location: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the thread pool, backend errors mapped by :meth:`_map_error`."""
        try:
            result: T = await to_thread(function, *args)
        except _CONTRACT_ERRORS:
            raise
        except Exception as exc:
            mapped = self._map_error(exc, f"{describe} {self.protocol}://{self._path(location)}")
            if mapped is None:
                raise
            raise mapped from exc
        return result

    def _missing(self, location: str) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, "no such object", f"{self.protocol}://{self._path(location)}")

    def _size(self, location: str) -> int:
        try:
            info = self._fs.info(self._path(location))
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(location) from None
        if info.get("type") != "file":  # a directory or prefix of other objects
            raise self._missing(location)
        return int(info["size"])

    def _write_blocking(self, location: str, buffers: list[memoryview]) -> None:
        path = self._path(location)
        parent = self._fs._parent(path)
        if parent:
            self._fs.makedirs(parent, exist_ok=True)
        try:
            with self._fs.open(path, "wb") as f:
                for buffer in buffers:
                    f.write(buffer)
        finally:
            self._fs.invalidate_cache(path)

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await self._run("write", location, self._write_blocking, location, as_buffers(data))

    def _read_blocking(self, location: str, byte_range: ByteRange | None) -> bytes:
        if byte_range is not None and byte_range.end > byte_range.start:
            # A non-empty range needs no size lookup first (one request instead of two or
            # three on object stores): a range past the end comes back short.
            start, end = byte_range.start, byte_range.end
        else:
            size = self._size(location)
            start, end = (0, size) if byte_range is None else (byte_range.start, byte_range.end)
            if end > size:
                raise _past_the_end(location, start, end, size)
            if start == end:
                return b""
        try:
            data = bytes(self._fs.cat_file(self._path(location), start=start, end=end))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # also: deleted since the lookup
            raise self._missing(location) from None
        except Exception:
            # A range that starts at or past the end is refused by some servers (HTTP 416).
            if byte_range is not None and (size := self._size(location)) < end:
                raise _past_the_end(location, start, end, size) from None
            raise
        if len(data) != end - start:
            raise EOFError(f"{location}: read {len(data)} bytes of range [{start}, {end}), the object ends before it")
        return data

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        data: bytes = await self._run("read", location, self._read_blocking, location, byte_range)
        return data

    def _delete_blocking(self, location: str) -> None:
        self._size(location)  # raises FileNotFoundError unless it is an object
        path = self._path(location)
        try:
            self._fs.rm_file(path)
        finally:
            self._fs.invalidate_cache(path)

    async def delete(self, location: str) -> None:
        await self._run("delete", location, self._delete_blocking, location)

    def _exists_blocking(self, location: str) -> bool:
        try:
            self._size(location)
        except BucketNotFoundError:
            raise
        except FileNotFoundError:
            return False
        return True

    async def exists(self, location: str) -> bool:
        found: bool = await self._run("exists", location, self._exists_blocking, location)
        return found

    def _list_blocking(self, prefix: str) -> list[str]:
        # List below the deepest "directory" of the prefix, then filter on the full prefix.
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        try:
            paths = self._fs.find(f"{self.root}/{directory}" if directory else self.root)
        except FileNotFoundError:
            return []
        base = self._fs._strip_protocol(self.root).rstrip("/") + "/"
        relative = (p[len(base) :] for p in paths if p.startswith(base))
        return sorted(r for r in relative if r.startswith(prefix))

    async def list(self, prefix: str = "") -> list[str]:
        found: list[str] = await self._run("list", prefix, self._list_blocking, prefix)
        return found

    async def close(self) -> None:
        return None


def _past_the_end(location: str, start: int, end: int, size: int) -> EOFError:
    return EOFError(f"{location}: range [{start}, {end}) reaches past the end of the object ({size} bytes)")
