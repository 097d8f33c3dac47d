"""The generic fsspec plugin: any scheme fsspec knows (``local://``, ``ftp://``, ``sftp://``, ...).

A fallback for schemes with no dedicated plugin. It speaks fsspec's synchronous API on the
snapshotkit thread pool; writes stream the caller's buffers into one file without joining them.
``write_exclusive`` checks then writes, so the commit marker is exclusive only in the absence of
a concurrent writer (``capabilities.atomic_exclusive_write`` is False).

It is also the base of the object-store plugins (GCS, S3), which override hooks rather than
operations: :meth:`~FsspecStoragePlugin._request` (how one request is attempted),
:meth:`~FsspecStoragePlugin._map_error` (backend errors to snapshotkit's),
:meth:`~FsspecStoragePlugin._missing_bucket`, :meth:`~FsspecStoragePlugin._size`,
:meth:`~FsspecStoragePlugin._read_whole`, :meth:`~FsspecStoragePlugin._range_failed`, and the
writes. Path mapping, the exists/read/delete/list shape, missing-object and past-the-end errors
stay here.
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
    return scheme in (fsspec_schemes() or ())


def fsspec_schemes() -> frozenset[str] | None:
    """The schemes fsspec has an implementation for (installed or not); None if fsspec is not installed."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return None
    return frozenset({*known_implementations, *registry})


def _missing_implementation(protocol: str, exc: ImportError) -> StorageError:
    """fsspec knows ``protocol`` but cannot import its implementation: name the package to install."""
    from fsspec.registry import known_implementations

    known = known_implementations.get(protocol, {})
    implementation = f" with {known['class']}" if "class" in known else ""
    says = known.get("err") or str(exc)
    error = StorageError(
        f"fsspec serves the {protocol}:// scheme{implementation}, which cannot be imported ({says}); "
        "install the package it names (pip install ...) into this environment"
    )
    error.__cause__ = exc
    return error


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
            try:
                filesystem = fsspec.filesystem(protocol, **dict(storage_options or {}))
            except ImportError as exc:
                raise _missing_implementation(protocol, exc) from exc
        self.protocol = protocol
        self.root = root.rstrip("/")
        self._fs = filesystem
        # Once found, the bucket is not looked up again: every missing object would cost a request.
        self._bucket_exists = False

    # ----------------------------------------------------------------- hooks

    def _path(self, location: str) -> str:
        return f"{self.root}/{location}"

    def _uri(self, location: str) -> str:
        return f"{self.protocol}://{self._path(location)}"

    def _request(self, describe: str, function: Callable[[], T]) -> T:
        """Send one idempotent request, ``function()``, blocking; ``describe`` names it in messages.

        fsspec filesystems retry (or not) inside their own calls, so the base just calls. A
        subclass that switched its filesystem's retries off retries here, per request, and maps
        errors here that must not reach the callers as they are (a missing bucket is a
        ``FileNotFoundError`` to s3fs, which the callers would take for a missing object).
        """
        return function()

    def _map_error(self, exc: Exception, describe: str) -> BaseException | None:
        """The snapshotkit error for a backend failure, or None to let it propagate unchanged.

        Subclasses extend this with their backend's permission and availability errors.
        """
        if isinstance(exc, PermissionError):
            return StoragePermissionError(f"{describe}: permission denied ({exc}); check the credentials")
        return None

    def _missing_bucket(self) -> BucketNotFoundError | None:
        """The error for a missing bucket, or None when it exists (blocking; the base has none).

        A 404 does not say whether the object or its bucket is missing, so :meth:`_missing` asks
        this until the bucket has been found once.
        """
        return None

    def _missing(self, location: str) -> FileNotFoundError:
        """The error for a missing object, or for its missing bucket."""
        if not self._bucket_exists:
            error = self._missing_bucket()
            if error is not None:
                return error
            self._bucket_exists = True
        return FileNotFoundError(errno.ENOENT, "no such object", self._uri(location))

    def _on_object(self, verb: str, location: str, function: Callable[[], T]) -> T:
        """One :meth:`_request` about ``location``; a missing object raises :meth:`_missing`'s error."""
        try:
            return self._request(f"{verb} {self._uri(location)}", function)
        except BucketNotFoundError:
            raise
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(location) from None

    async def _run(self, describe: str, location: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the thread pool, backend errors mapped by :meth:`_map_error`."""
        try:
            result: T = await to_thread(function, *args)
        except _CONTRACT_ERRORS:
            raise
        except Exception as exc:
            mapped = self._map_error(exc, f"{describe} {self._uri(location)}")
            if mapped is None:
                raise
            raise mapped from exc
        return result

    def _size(self, location: str) -> int:
        """The size of the object ``location`` (blocking); a "directory" is a missing object."""
        path = self._path(location)
        info = self._on_object("info", location, lambda: self._fs.info(path))
        if info.get("type") != "file":  # a directory or prefix of other objects
            raise self._missing(location)
        return int(info["size"])

    def _get(self, location: str, start: int | None = None, end: int | None = None) -> bytes:
        """One read of ``location``: all of it, or ``[start, end)`` (which may come back short)."""
        path = self._path(location)
        verb = "read" if start is None else f"read[{start}:{end}]"
        return bytes(self._on_object(verb, location, lambda: self._fs.cat_file(path, start=start, end=end)))

    def _read_whole(self, location: str) -> bytes:
        """All of ``location`` (blocking).

        The base looks the size up first: reading a directory does not fail on every
        filesystem, and the lookup makes it a missing object.
        """
        size = self._size(location)
        return _exactly(location, self._get(location, 0, size), 0, size) if size else b""

    def _range_failed(self, location: str, exc: Exception, start: int, end: int) -> None:
        """Raise ``EOFError`` if reading ``[start, end)`` failed with ``exc`` for ending past the object.

        Some servers refuse a range that starts at or past the end (HTTP 416) rather than
        answering short; the base looks the size up to tell. Returning lets ``exc`` propagate.
        """
        if (size := self._size(location)) < end:
            raise _past_the_end(location, start, end, size) from None

    # ----------------------------------------------------------------- operations

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
        if byte_range is None:
            return self._read_whole(location)
        start, end = byte_range.start, byte_range.end
        if start == end:  # no read can tell whether an empty range is inside the object
            size = self._size(location)
            if end > size:
                raise _past_the_end(location, start, end, size)
            return b""
        # A non-empty range needs no size lookup first (one request instead of two or three on
        # object stores): a range past the end comes back short.
        try:
            data = self._get(location, start, end)
        except _CONTRACT_ERRORS:
            raise
        except Exception as exc:
            self._range_failed(location, exc, start, end)
            raise
        return _exactly(location, data, start, end)

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        data: bytes = await self._run("read", location, self._read_blocking, location, byte_range)
        return data

    def _delete_blocking(self, location: str) -> None:
        # The lookup raises FileNotFoundError unless it is an object: deleting a missing key
        # succeeds on object stores, and the contract wants an error.
        self._size(location)
        path = self._path(location)
        try:
            self._on_object("delete", location, lambda: self._fs.rm_file(path))
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
        top = f"{self.root}/{directory}" if directory else self.root
        try:
            paths = self._request(f"list {self.protocol}://{top}", lambda: self._fs.find(top))
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


def span(buffers: Sequence[memoryview], start: int, end: int) -> memoryview | bytes:
    """Bytes ``[start, end)`` of the concatenation of ``buffers``: a view when one buffer holds
    them all (an upload's part or chunk is then never copied), else one copy."""
    pieces = []
    offset = 0
    for buffer in buffers:
        low, high = max(start, offset), min(end, offset + buffer.nbytes)
        if low < high:
            pieces.append(buffer[low - offset : high - offset])
        offset += buffer.nbytes
        if offset >= end:
            break
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _exactly(location: str, data: bytes, start: int, end: int) -> bytes:
    """``data``, the read of ``[start, end)``, if it is that long; a short read is an EOFError."""
    if len(data) != end - start:
        raise EOFError(f"{location}: read {len(data)} bytes of range [{start}, {end}), the object ends before it")
    return data


def _past_the_end(location: str, start: int, end: int, size: int) -> EOFError:
    return EOFError(f"{location}: range [{start}, {end}) reaches past the end of the object ({size} bytes)")
