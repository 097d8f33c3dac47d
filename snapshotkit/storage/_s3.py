"""The S3 plugin: ``s3://bucket/prefix`` through s3fs (any S3-compatible endpoint).

It speaks s3fs's synchronous API (which runs on fsspec's own I/O loop) from the snapshotkit
thread pool, so a plugin works from any event loop. Small objects go up as one ``PutObject``;
objects larger than ``part_size_bytes`` as a multipart upload whose parts are sent up to
``max_concurrency`` at a time. The commit marker is a conditional ``PutObject`` with
``If-None-Match: *``, which S3 (since 2024), SeaweedFS, and most S3-compatible servers apply
atomically (``capabilities.atomic_exclusive_write`` is True).

Storage options are passed to :class:`s3fs.S3FileSystem` (``endpoint_url``, ``key``,
``secret``, ``client_kwargs``, ...), after popping the snapshotkit-specific ones:

* ``part_size_bytes`` (default 16 MiB, at least 5 MiB): multipart threshold and part size.
* ``max_concurrency`` (default 4): parts of one object uploaded at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._async import to_thread
from ..errors import ConfigError, StorageError
from ._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

DEFAULT_PART_SIZE_BYTES = 16 * 1024 * 1024
MIN_PART_SIZE_BYTES = 5 * 1024 * 1024  # S3 rejects smaller parts (except the last)
MAX_PARTS = 10_000
DEFAULT_MAX_CONCURRENCY = 4


def _error_code(exc: BaseException) -> str | None:
    """The S3 error code behind an exception s3fs translated from a botocore ``ClientError``."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code is not None else None
        seen = seen.__cause__
    return None


def _join(buffers: list[memoryview], start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the concatenation of ``buffers`` (one copy)."""
    pieces = []
    offset = 0
    for buffer in buffers:
        low, high = max(start, offset), min(end, offset + buffer.nbytes)
        if low < high:
            pieces.append(buffer[low - offset : high - offset])
        offset += buffer.nbytes
        if offset >= end:
            break
    return b"".join(pieces)


class S3StoragePlugin(StoragePlugin):
    """Objects of an S3 bucket below ``root`` (``"bucket"`` or ``"bucket/prefix"``)."""

    capabilities = Capabilities(atomic_exclusive_write=True, listing=True)

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import s3fs
        except ImportError:
            raise StorageError('the "s3" scheme needs s3fs: pip install "snapshotkit[s3]"') from None
        options = dict(storage_options or {})
        self.part_size_bytes = int(options.pop("part_size_bytes", DEFAULT_PART_SIZE_BYTES))
        self.max_concurrency = int(options.pop("max_concurrency", DEFAULT_MAX_CONCURRENCY))
        if self.part_size_bytes < MIN_PART_SIZE_BYTES:
            raise ConfigError(f"part_size_bytes must be at least {MIN_PART_SIZE_BYTES} (S3's minimum part size)")
        if self.max_concurrency < 1:
            raise ConfigError("max_concurrency must be at least 1")
        # No listing cache: another writer (or this plugin's own low-level calls) would make it stale.
        options.setdefault("use_listings_cache", False)
        bucket, _, prefix = root.strip("/").partition("/")
        if not bucket:
            raise ConfigError(f"S3 root {root!r} names no bucket (expected s3://bucket[/prefix])")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._fs = s3fs.S3FileSystem(**options)
        self._closed = False

    # ----------------------------------------------------------------- helpers

    def _key(self, location: str) -> str:
        return f"{self.prefix}/{location}" if self.prefix else location

    def _uri(self, location: str) -> str:
        return f"s3://{self.bucket}/{self._key(location)}"

    def _missing(self, location: str) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, "no such object", self._uri(location))

    def _call(self, method: str, location: str, **kwargs: Any) -> Any:
        """``fs.call_s3(method, Bucket=..., Key=...)``, mapping a missing object to FileNotFoundError."""
        try:
            return self._fs.call_s3(method, Bucket=self.bucket, Key=self._key(location), **kwargs)
        except FileNotFoundError:
            raise self._missing(location) from None

    def _size(self, location: str) -> int:
        # HeadObject names exactly one key: a "directory" prefix of other objects is missing.
        head = self._call("head_object", location)
        return int(head["ContentLength"])

    # ----------------------------------------------------------------- write

    def _put_blocking(self, location: str, body: bytes, exclusive: bool) -> None:
        extra = {"IfNoneMatch": "*"} if exclusive else {}
        try:
            self._call("put_object", location, Body=body, **extra)
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, "object exists", self._uri(location)) from None
        except OSError as exc:
            if exclusive and _error_code(exc) in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                raise FileExistsError(errno.EEXIST, "object exists", self._uri(location)) from None
            raise

    async def _multipart(self, location: str, buffers: list[memoryview], total: int) -> None:
        part_size = max(self.part_size_bytes, -(-total // MAX_PARTS))
        created = await to_thread(lambda: self._call("create_multipart_upload", location))
        upload_id = created["UploadId"]
        semaphore = asyncio.Semaphore(self.max_concurrency)

        def upload(number: int, start: int, end: int) -> dict[str, Any]:
            body = _join(buffers, start, end)
            response = self._call("upload_part", location, UploadId=upload_id, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": response["ETag"]}

        async def bounded(number: int, start: int) -> dict[str, Any]:
            async with semaphore:
                part: dict[str, Any] = await to_thread(upload, number, start, min(start + part_size, total))
                return part

        try:
            parts = await asyncio.gather(
                *(bounded(n, start) for n, start in enumerate(range(0, total, part_size), start=1))
            )
            await to_thread(
                lambda: self._call(
                    "complete_multipart_upload", location, UploadId=upload_id, MultipartUpload={"Parts": list(parts)}
                )
            )
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: the original error matters more
                await to_thread(lambda: self._call("abort_multipart_upload", location, UploadId=upload_id))
            raise

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        buffers = as_buffers(data)
        total = sum(b.nbytes for b in buffers)
        if total <= self.part_size_bytes:
            await to_thread(self._put_blocking, location, _join(buffers, 0, total), False)
        else:
            await self._multipart(location, buffers, total)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        # One conditional PutObject (If-None-Match: *): atomic on S3 and SeaweedFS. Commit
        # markers are tiny, so the single-put path is always taken.
        buffers = as_buffers(data)
        total = sum(b.nbytes for b in buffers)
        await to_thread(self._put_blocking, location, _join(buffers, 0, total), True)

    # ----------------------------------------------------------------- read

    def _read_blocking(self, location: str, byte_range: ByteRange | None) -> bytes:
        path = f"{self.bucket}/{self._key(location)}"
        if byte_range is None:
            try:
                return bytes(self._fs.cat_file(path))
            except FileNotFoundError:
                raise self._missing(location) from None
        start, end = byte_range.start, byte_range.end
        if start == end:
            size = self._size(location)
            if end > size:
                raise EOFError(f"{location}: range [{start}, {end}) reaches past the end of the object ({size} bytes)")
            return b""
        try:
            data = bytes(self._fs.cat_file(path, start=start, end=end))
        except FileNotFoundError:
            raise self._missing(location) from None
        except OSError as exc:
            if _error_code(exc) in {"InvalidRange", "416"}:
                raise EOFError(f"{location}: range [{start}, {end}) starts past the end of the object") from None
            raise
        if len(data) != end - start:
            raise EOFError(f"{location}: read {len(data)} bytes of range [{start}, {end})")
        return data

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        data: bytes = await to_thread(self._read_blocking, location, byte_range)
        return data

    async def exists(self, location: str) -> bool:
        try:
            await to_thread(self._size, location)
        except FileNotFoundError:
            return False
        return True

    # ----------------------------------------------------------------- delete and list

    def _delete_blocking(self, location: str) -> None:
        self._size(location)  # DeleteObject succeeds on a missing key; the contract wants an error
        self._call("delete_object", location)

    async def delete(self, location: str) -> None:
        await to_thread(self._delete_blocking, location)

    def _list_blocking(self, prefix: str) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        found: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base + prefix}
        while True:
            try:
                page = self._fs.call_s3("list_objects_v2", **kwargs)
            except FileNotFoundError:  # no such bucket: nothing stored
                return []
            for item in page.get("Contents", []):
                key = str(item["Key"])
                if key.startswith(base) and not key.endswith("/"):
                    found.append(key[len(base) :])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
        return sorted(found)

    async def list(self, prefix: str = "") -> list[str]:
        found: list[str] = await to_thread(self._list_blocking, prefix)
        return found

    def _delete_many_blocking(self, locations: Sequence[str]) -> None:
        for start in range(0, len(locations), 1000):  # DeleteObjects takes at most 1000 keys
            keys = [{"Key": self._key(location)} for location in locations[start : start + 1000]]
            response = self._fs.call_s3("delete_objects", Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
            errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise StorageError(
                    f"s3://{self.bucket}: could not delete {len(errors)} objects, "
                    f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    async def delete_prefix(self, prefix: str) -> None:
        locations = await self.list(prefix)
        if locations:
            await to_thread(self._delete_many_blocking, locations)

    async def close(self) -> None:
        # The S3FileSystem may be shared through fsspec's instance cache with other plugins of
        # the same options, so its client is left to fsspec (closed at exit / garbage collection).
        if not self._closed:
            self._closed = True
            self._fs.invalidate_cache()
