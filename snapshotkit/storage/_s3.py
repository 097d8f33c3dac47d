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
* ``upload_checksum`` (default ``"crc32c"``): every ``PutObject`` and ``UploadPart`` carries
  the CRC-32C of its body, computed by snapshotkit with the CPU's CRC instruction on its own
  threads, and the server refuses a body that arrived different (``BadDigest``, retried).
  ``"botocore"`` leaves the request checksum to botocore's ``request_checksum_calculation``
  setting (CRC-32 in software, on s3fs's one I/O thread), for servers without CRC-32C.

Each part is copied once into ``bytes`` (botocore takes no memoryviews, and hands bytes to
aiohttp as a file object read in 64 KiB pieces); measured against SeaweedFS, sending views
instead changed neither the client's CPU time nor the wall time.

Retries are snapshotkit's one retry layer's (:mod:`snapshotkit.storage._retry_layer`, under the
``retry`` storage option), which retries whole operations; :meth:`S3StoragePlugin.is_transient`
tells it which failures qualify: connection resets and timeouts, HTTP 5xx and 429, and the S3
codes ``SlowDown``, ``InternalError``, ``ServiceUnavailable``, ``RequestTimeout`` and friends.
botocore's and s3fs's own retries are switched off (unless ``config_kwargs`` sets ``retries``)
so attempts never multiply. Refused credentials (``AccessDenied``, ``InvalidAccessKeyId``,
``SignatureDoesNotMatch``, any 403) raise :class:`~snapshotkit.errors.StoragePermissionError`
and a missing bucket :class:`~snapshotkit.errors.BucketNotFoundError`, at once.

The plugin's filesystems are a private ``S3FileSystem`` subclass, so fsspec shares them only
between snapshotkit plugins with equal options and their settings never leak into other users
of s3fs in the process.

The plugin is the generic fsspec plugin (:class:`~snapshotkit.storage.FsspecStoragePlugin`)
with S3's hooks: each request's errors mapped, sizes by ``HeadObject``,
whole-object reads with no size lookup first, ``InvalidRange`` as past the end, and its own
writes, commit marker, listing and batched ``delete_prefix``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import crc32c

from snapshotkit._runtime.loop import to_thread
from snapshotkit.errors import BucketNotFoundError, ConfigError, StorageError, StoragePermissionError
from snapshotkit.storage._base import Capabilities, as_buffers
from snapshotkit.storage._fsspec import FsspecStoragePlugin, span
from snapshotkit.storage._retry import is_transient_error

if TYPE_CHECKING:
    from typing_extensions import Buffer

DEFAULT_PART_SIZE_BYTES = 16 * 1024 * 1024
MIN_PART_SIZE_BYTES = 5 * 1024 * 1024  # S3 rejects smaller parts (except the last)
MAX_PARTS = 10_000
DEFAULT_MAX_CONCURRENCY = 4
#: Values of the ``upload_checksum`` storage option.
UPLOAD_CHECKSUMS = ("crc32c", "botocore")

T = TypeVar("T")


#: S3 error codes of failures that may succeed when retried.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestThrottled",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "OperationAborted",
        "BadDigest",  # the body's checksum did not match: damaged on the way, send it again
        "XAmzContentChecksumMismatch",
    }
)
#: S3 error codes of refused credentials or permissions.
PERMISSION_CODES = frozenset(
    {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403"}
)


def _response(exc: BaseException) -> dict[str, Any] | None:
    """The botocore response behind an exception s3fs translated from a ``ClientError``."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return response
        seen = seen.__cause__
    return None


def _error_code(exc: BaseException) -> str | None:
    """The S3 error code behind ``exc``, if it came from an S3 error response."""
    response = _response(exc)
    code = response.get("Error", {}).get("Code") if response else None
    return str(code) if code is not None else None


def _http_status(exc: BaseException) -> int | None:
    response = _response(exc)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if response else None
    return int(status) if status is not None else None


def is_transient(exc: BaseException) -> bool:
    """Whether an S3 request that raised ``exc`` may succeed when retried."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, EOFError, PermissionError, StorageError)):
        return is_transient_error(exc)  # answers, refused credentials, a missing bucket: no
    if is_transient_error(exc):
        return True
    status = _http_status(exc)
    return _error_code(exc) in TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429))


def _crc32c_header(body: bytes) -> str:
    """S3's ``x-amz-checksum-crc32c`` value of ``body``: the big-endian CRC, base64."""
    return base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode("ascii")


@functools.cache
def _filesystem_class(base: type[Any]) -> type[Any]:
    """``s3fs.S3FileSystem`` with s3fs's own retry loop reduced to one attempt (the retry layer retries)."""
    return type("SnapshotkitS3FileSystem", (base,), {"retries": 1, "__module__": __name__})


class S3StoragePlugin(FsspecStoragePlugin):
    """Objects of an S3 bucket below ``root`` (``"bucket"`` or ``"bucket/prefix"``).

    Path mapping, reads, ``exists``, ``delete`` and the error shapes are the generic fsspec
    plugin's; S3 supplies the request hooks, the writes, the listing and ``delete_prefix``.
    """

    capabilities = Capabilities(atomic_exclusive_write=True, atomic_replace=True, listing=True)

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
        self.upload_checksum = str(options.pop("upload_checksum", UPLOAD_CHECKSUMS[0]))
        if self.upload_checksum not in UPLOAD_CHECKSUMS:
            raise ConfigError(f"upload_checksum must be one of {UPLOAD_CHECKSUMS}, got {self.upload_checksum!r}")
        options.pop("retry", None)  # the retry layer's option (gone already when opened by URI)
        # No listing cache: another writer (or this plugin's own low-level calls) would make it stale.
        options.setdefault("use_listings_cache", False)
        # The retry layer retries; botocore's own retries would multiply attempts.
        config = dict(options.pop("config_kwargs", None) or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        options["config_kwargs"] = config
        bucket, _, prefix = root.strip("/").partition("/")
        if not bucket:
            raise ConfigError(f"S3 root {root!r} names no bucket (expected s3://bucket[/prefix])")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        filesystem = _filesystem_class(s3fs.S3FileSystem)(**options)
        super().__init__("s3", f"{bucket}/{self.prefix}" if self.prefix else bucket, filesystem=filesystem)
        self._closed = False

    # ----------------------------------------------------------------- hooks

    def _key(self, location: str) -> str:
        return f"{self.prefix}/{location}" if self.prefix else location

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    def _request(self, describe: str, function: Callable[[], T]) -> T:
        """One request; refused credentials and missing buckets mapped."""
        try:
            return function()
        except StorageError:  # mapped already
            raise
        except Exception as exc:
            # Mapped here, not only by _run: s3fs makes NoSuchBucket a FileNotFoundError, which
            # the callers would take for a missing object.
            mapped = self._map_error(exc, describe)
            if mapped is None:
                raise
            raise mapped from exc

    def _map_error(self, exc: Exception, describe: str) -> BaseException | None:
        code = _error_code(exc)
        if code == "NoSuchBucket":
            return self._no_bucket(describe)
        if code in PERMISSION_CODES or _http_status(exc) == 403 or isinstance(exc, PermissionError):
            return StoragePermissionError(
                f"{describe}: access denied ({code or type(exc).__name__}: {exc}). Check the credentials "
                "(storage_options key/secret/token, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_PROFILE) "
                "and that they may read and write this bucket"
            )
        return super()._map_error(exc, describe)

    def _no_bucket(self, describe: str) -> BucketNotFoundError:
        where = f" at {self._fs.endpoint_url}" if self._fs.endpoint_url else ""
        return BucketNotFoundError(
            f"{describe}: the bucket {self.bucket!r} does not exist{where}; create it first, or fix the URI "
            "(s3://bucket/prefix) or the endpoint_url storage option"
        )

    def _missing_bucket(self) -> BucketNotFoundError | None:
        try:
            self._request(f"HEAD s3://{self.bucket}", lambda: self._fs.call_s3("head_bucket", Bucket=self.bucket))
        except FileNotFoundError:
            return self._no_bucket(f"s3://{self.bucket}")
        return None

    def _call(self, method: str, location: str, **kwargs: Any) -> Any:
        """``fs.call_s3(method, Bucket=..., Key=..., **kwargs)`` about ``location``, under :meth:`_on_object`."""
        key = self._key(location)
        return self._on_object(
            method, location, lambda: self._fs.call_s3(method, Bucket=self.bucket, Key=key, **kwargs)
        )

    def _size(self, location: str) -> int:
        # HeadObject names exactly one key: a "directory" prefix of other objects is missing.
        # (s3fs's info() would list the prefix of a missing key too: a second request.)
        head = self._call("head_object", location)
        return int(head["ContentLength"])

    def _read_whole(self, location: str) -> bytes:
        # No size lookup first: a GET names exactly one key, as HeadObject does.
        return self._get(location)

    def _range_failed(self, location: str, exc: Exception, start: int, end: int) -> None:
        # S3 answers a range that starts past the end with 416 InvalidRange: no HEAD needed to tell.
        if _error_code(exc) in {"InvalidRange", "416"}:
            raise EOFError(f"{location}: range [{start}, {end}) starts past the end of the object") from None

    # ----------------------------------------------------------------- write

    def _checksum(self, body: bytes) -> dict[str, str]:
        """The checksum arguments of a request that sends ``body``."""
        return {"ChecksumCRC32C": _crc32c_header(body)} if self.upload_checksum == "crc32c" else {}

    def _put_blocking(self, location: str, buffers: list[memoryview], exclusive: bool) -> None:
        body = bytes(span(buffers, 0, sum(b.nbytes for b in buffers)))
        if not exclusive:
            self._call("put_object", location, Body=body, **self._checksum(body))
            return
        try:
            self._call("put_object", location, Body=body, IfNoneMatch="*", **self._checksum(body))
        except OSError as exc:
            refused = isinstance(exc, FileExistsError) or _error_code(exc) in {
                "PreconditionFailed",
                "412",
                "ConditionalRequestConflict",
            }
            if not refused:
                raise
            # A conditional PUT that aiohttp re-sent on a dropped keep-alive connection after
            # its response was lost is refused by the object its first attempt wrote (the retry
            # layer checks its own retries the same way). Exclusive payloads are unique (a
            # manifest names its take), so an object holding exactly these bytes is this write's own.
            if self._read_whole(location) == body:
                return
            raise FileExistsError(errno.EEXIST, "object exists", self._uri(location)) from None

    async def _multipart(self, location: str, buffers: list[memoryview], total: int) -> None:
        part_size = max(self.part_size_bytes, -(-total // MAX_PARTS))
        algorithm = {"ChecksumAlgorithm": "CRC32C"} if self.upload_checksum == "crc32c" else {}
        created = await to_thread(lambda: self._call("create_multipart_upload", location, **algorithm))
        upload_id = created["UploadId"]
        semaphore = asyncio.Semaphore(self.max_concurrency)

        def upload(number: int, start: int, end: int) -> dict[str, Any]:
            body = bytes(span(buffers, start, end))
            checksum = self._checksum(body)  # on this pool thread, beside the other parts
            response = self._call("upload_part", location, UploadId=upload_id, PartNumber=number, Body=body, **checksum)
            return {"PartNumber": number, "ETag": response["ETag"], **checksum}

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
            await self._run("write", location, self._put_blocking, location, buffers, False)
        else:
            await self._multipart(location, buffers, total)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        # One conditional PutObject (If-None-Match: *): atomic on S3 and SeaweedFS. Commit
        # markers are tiny, so the single-put path is always taken.
        await self._run("create", location, self._put_blocking, location, as_buffers(data), True)

    # ----------------------------------------------------------------- list and delete

    def _list_blocking(self, prefix: str) -> list[str]:
        # ListObjectsV2 on the full key prefix: one request per 1000 keys, where s3fs's find()
        # lists from the "directory" and looks a missing prefix up again.
        base = f"{self.prefix}/" if self.prefix else ""
        found: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base + prefix}
        while True:
            page = self._request(
                f"list_objects_v2 s3://{self.bucket}/{kwargs['Prefix']}",
                lambda: self._fs.call_s3("list_objects_v2", **kwargs),
            )
            for item in page.get("Contents", []):
                key = str(item["Key"])
                if key.startswith(base) and not key.endswith("/"):
                    found.append(key[len(base) :])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
        return sorted(found)

    def _delete_many_blocking(self, locations: Sequence[str]) -> None:
        for start in range(0, len(locations), 1000):  # DeleteObjects takes at most 1000 keys
            keys = [{"Key": self._key(location)} for location in locations[start : start + 1000]]
            response = self._request(
                f"delete_objects s3://{self.bucket} ({len(keys)} keys)",
                functools.partial(
                    self._fs.call_s3, "delete_objects", Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True}
                ),
            )
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
            await self._run("delete_prefix", prefix, self._delete_many_blocking, locations)

    async def close(self) -> None:
        # The S3FileSystem may be shared through fsspec's instance cache with other plugins of
        # the same options, so its client is left to fsspec (closed at exit / garbage collection).
        if not self._closed:
            self._closed = True
            self._fs.invalidate_cache()
