"""The Google Cloud Storage plugin (``gs://bucket/prefix``, also ``gcs://``), built on gcsfs.

It speaks gcsfs's synchronous API on the snapshotkit thread pool (gcsfs runs its own I/O loop,
so this works whichever event loop awaits the plugin). Objects no larger than the block size
go up in one request; larger ones stream the caller's buffers, in order and without joining
them, into a resumable upload of ``block_size`` chunks. Ranged reads use absolute offsets
(never suffix ranges, which some emulators ignore).

``storage_options`` go to :class:`gcsfs.GCSFileSystem` unchanged (``project``, ``token``,
``endpoint_url``, ``block_size``, ...), with two defaults: ``use_listings_cache=False`` so a
listing can never be stale, and ``token="anon"`` when ``STORAGE_EMULATOR_HOST`` names an
emulator and no token is given (emulators accept no credentials, and there are none to find).

The commit marker is written with GCS's ``ifGenerationMatch=0`` precondition (gcsfs's
``pipe_file(..., mode="create")``): the write fails with ``FileExistsError`` if the object
exists, atomically, so ``capabilities.atomic_exclusive_write`` is True.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._async import to_thread
from ..errors import StorageError
from ._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

# gcsfs >= 2026.6 otherwise asks the Storage Control gRPC API for each bucket's layout, which
# against emulators stalls every operation for 30-75 s. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import gcsfs

#: Default upload chunk: objects up to this size are one request, larger ones a resumable upload
#: in chunks of this size. GCS needs a multiple of 256 KiB. Override with ``block_size``.
DEFAULT_BLOCK_SIZE = 16 * 1024 * 1024
_CHUNK_QUANTUM = 256 * 1024


class GCSStoragePlugin(StoragePlugin):
    """Objects of a GCS bucket below ``root`` (``"bucket"`` or ``"bucket/prefix"``)."""

    capabilities = Capabilities(atomic_exclusive_write=True, listing=True)

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.root = root.strip("/")
        if not self.root or self.root.split("/", 1)[0] == "":
            raise StorageError(f"gs:// URI needs a bucket: gs://{root!r}")
        options = dict(storage_options or {})
        options.setdefault("use_listings_cache", False)
        if "token" not in options and os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default"):
            options["token"] = "anon"  # noqa: S105 - gcsfs anonymous access, not a secret
        block_size = int(options.get("block_size") or DEFAULT_BLOCK_SIZE)
        if block_size <= 0 or block_size % _CHUNK_QUANTUM:
            raise StorageError(f"GCS block_size must be a positive multiple of 256 KiB, got {block_size}")
        self.block_size = block_size
        self._fs = gcsfs.GCSFileSystem(**options)

    def _path(self, location: str) -> str:
        return f"{self.root}/{location}"

    def _missing(self, location: str) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, "no such object", f"gs://{self._path(location)}")

    def _size(self, location: str) -> int:
        try:
            info = self._fs.info(self._path(location))
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(location) from None
        if info.get("type") != "file":  # a prefix of other objects ("directory")
            raise self._missing(location)
        return int(info["size"])

    # ----------------------------------------------------------------- write

    def _write_blocking(self, location: str, buffers: list[memoryview]) -> None:
        path = self._path(location)
        total = sum(b.nbytes for b in buffers)
        try:
            if total <= self.block_size:
                # One request; gcsfs builds the multipart body with one copy either way.
                data: bytes | memoryview = buffers[0] if len(buffers) == 1 else b"".join(buffers)
                self._fs.pipe_file(path, data)
            else:
                with self._fs.open(path, "wb", block_size=self.block_size) as f:
                    for buffer in buffers:
                        f.write(buffer)
        finally:
            self._fs.invalidate_cache(path)

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_blocking, location, as_buffers(data))

    def _write_exclusive_blocking(self, location: str, buffers: list[memoryview]) -> None:
        path = self._path(location)
        data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
        try:
            # ifGenerationMatch=0: GCS refuses (412 -> FileExistsError) if the object exists.
            self._fs.pipe_file(path, data, mode="create")
        finally:
            self._fs.invalidate_cache(path)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await to_thread(self._write_exclusive_blocking, location, as_buffers(data))

    # ----------------------------------------------------------------- read

    def _read_blocking(self, location: str, byte_range: ByteRange | None) -> bytes:
        size = self._size(location)
        start, end = (0, size) if byte_range is None else (byte_range.start, byte_range.end)
        if end > size:
            raise EOFError(f"{location}: range [{start}, {end}) reaches past the end of the object ({size} bytes)")
        if start == end:
            return b""
        try:
            data = bytes(self._fs.cat_file(self._path(location), start=start, end=end))
        except FileNotFoundError:  # deleted between info and read
            raise self._missing(location) from None
        if len(data) != end - start:
            raise EOFError(f"{location}: read {len(data)} bytes of range [{start}, {end})")
        return data

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        data: bytes = await to_thread(self._read_blocking, location, byte_range)
        return data

    # ----------------------------------------------------------------- delete, exists, list

    def _delete_blocking(self, location: str) -> None:
        self._size(location)  # raises FileNotFoundError unless it is an object
        path = self._path(location)
        try:
            self._fs.rm_file(path)
        finally:
            self._fs.invalidate_cache(path)

    async def delete(self, location: str) -> None:
        await to_thread(self._delete_blocking, location)

    def _exists_blocking(self, location: str) -> bool:
        try:
            self._size(location)
        except FileNotFoundError:
            return False
        return True

    async def exists(self, location: str) -> bool:
        found: bool = await to_thread(self._exists_blocking, location)
        return found

    def _list_blocking(self, prefix: str) -> list[str]:
        # List below the deepest "directory" of the prefix, then filter on the full prefix.
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root + "/"
        try:
            paths = self._fs.find(base + directory if directory else self.root)
        except FileNotFoundError:
            return []
        relative = (p[len(base) :] for p in paths if p.startswith(base))
        return sorted(r for r in relative if r.startswith(prefix))

    async def list(self, prefix: str = "") -> list[str]:
        found: list[str] = await to_thread(self._list_blocking, prefix)
        return found

    async def close(self) -> None:
        # gcsfs instances are shared (fsspec caches them by options) and own their HTTP session
        # on gcsfs's I/O loop, which cleans it up at exit; closing here would break other users.
        return None
