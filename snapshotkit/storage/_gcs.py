"""The Google Cloud Storage plugin (``gs://bucket/prefix``, also ``gcs://``), built on gcsfs.

It speaks gcsfs's synchronous API on the snapshotkit thread pool (gcsfs runs its own I/O loop,
so this works whichever event loop awaits the plugin). Objects no larger than the block size
go up in one request; larger ones as a resumable upload of ``block_size`` chunks, each chunk a
view of the caller's buffers (copied only where it spans two of them). A failed chunk cancels
the upload session, so nothing half-written becomes visible. Ranged reads use absolute offsets
(never suffix ranges, which some emulators ignore).

``storage_options`` go to :class:`gcsfs.GCSFileSystem` unchanged (``project``, ``token``,
``endpoint_url``, ``block_size``, ...), with two defaults: ``use_listings_cache=False`` so a
listing can never be stale, and ``token="anon"`` when ``STORAGE_EMULATOR_HOST`` names an
emulator and no token is given (emulators accept no credentials, and there are none to find).

gcsfs retries each request itself, so the plugin declares ``capabilities.own_retries`` and
snapshotkit's retry layer leaves it alone (the ``retry`` storage option does not apply).

The commit marker is written with GCS's ``ifGenerationMatch=0`` precondition (gcsfs's
``pipe_file(..., mode="create")``): the write fails with ``FileExistsError`` if the object
exists, atomically, so ``capabilities.atomic_exclusive_write`` is True.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from snapshotkit.errors import BucketNotFoundError, StorageError, StoragePermissionError
from snapshotkit.storage._base import Capabilities, as_buffers
from snapshotkit.storage._fsspec import FsspecStoragePlugin, span

if TYPE_CHECKING:
    from typing_extensions import Buffer

# gcsfs >= 2026.6 otherwise asks the Storage Control gRPC API for each bucket's layout, which
# against emulators stalls every operation for 30-75 s. Must be set before gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import gcsfs
import gcsfs.core
from fsspec.asyn import sync

#: Default upload chunk: objects up to this size are one request, larger ones a resumable upload
#: in chunks of this size. GCS needs a multiple of 256 KiB. Override with ``block_size``.
DEFAULT_BLOCK_SIZE = 16 * 1024 * 1024
_CHUNK_QUANTUM = 256 * 1024


class GCSStoragePlugin(FsspecStoragePlugin):
    """Objects of a GCS bucket below ``root`` (``"bucket"`` or ``"bucket/prefix"``).

    Reads, deletes, listing and ``close`` are the generic fsspec plugin's; GCS adds single-request
    or resumable writes by size and a create-only commit marker.
    """

    # gcsfs retries each request itself (6 attempts on 408/429/5xx and connection errors): the
    # retry layer must not multiply them.
    capabilities = Capabilities(atomic_exclusive_write=True, atomic_replace=True, listing=True, own_retries=True)

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        root = root.strip("/")
        if not root or root.split("/", 1)[0] == "":
            raise StorageError(f"gs:// URI needs a bucket: gs://{root!r}")
        options = dict(storage_options or {})
        options.setdefault("use_listings_cache", False)
        if "token" not in options and os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default"):
            options["token"] = "anon"  # noqa: S105 - gcsfs anonymous access, not a secret
        block_size = int(options.get("block_size") or DEFAULT_BLOCK_SIZE)
        if block_size <= 0 or block_size % _CHUNK_QUANTUM:
            raise StorageError(f"GCS block_size must be a positive multiple of 256 KiB, got {block_size}")
        self.block_size = block_size
        # gcsfs instances are shared (fsspec caches them by options) and own their HTTP session
        # on gcsfs's I/O loop, which cleans it up at exit: close() leaves them alone.
        super().__init__("gs", root, filesystem=gcsfs.GCSFileSystem(**options))
        self.bucket = root.split("/", 1)[0]

    # ----------------------------------------------------------------- errors

    def _map_error(self, exc: Exception, describe: str) -> BaseException | None:
        # gcsfs raises OSError("Forbidden: ...") for 403 and HttpError(code=401) for refused tokens.
        code = getattr(exc, "code", None)
        if code in (401, 403) or str(exc).startswith("Forbidden"):
            reason = " ".join(str(exc).split())
            return StoragePermissionError(
                f"{describe}: access denied ({reason}). Check the credentials (storage_options token/project, "
                "GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth application-default login) and the bucket's IAM"
            )
        return super()._map_error(exc, describe)

    def _missing_bucket(self) -> BucketNotFoundError | None:
        try:
            self._fs.call("GET", "b/{}", self.bucket, json_out=True)
        except FileNotFoundError:
            endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "GCS"
            return BucketNotFoundError(
                f"gs://{self.bucket}: the bucket does not exist ({endpoint}); create it first or fix the URI"
            )
        return None

    # ----------------------------------------------------------------- write

    def _write_blocking(self, location: str, buffers: list[memoryview]) -> None:
        path = self._path(location)
        total = sum(b.nbytes for b in buffers)
        try:
            if total <= self.block_size:
                # One request; gcsfs builds the multipart body with one copy either way.
                data: bytes | memoryview = buffers[0] if len(buffers) == 1 else b"".join(buffers)
                self._fs.pipe_file(path, data, chunksize=total + 1)  # below chunksize: one request
            else:
                sync(self._fs.loop, self._resumable, path, buffers, total)
        except FileNotFoundError:  # an upload can only miss its bucket
            raise self._missing(location) from None
        finally:
            self._fs.invalidate_cache(path)

    async def _resumable(self, path: str, buffers: list[memoryview], total: int) -> None:
        """A resumable upload of ``buffers`` in ``block_size`` chunks (on gcsfs's loop).

        gcsfs's own file object would copy every byte twice (into its buffer, then out of it)."""
        bucket, key, _ = self._fs.split_path(path)
        session = await gcsfs.core.initiate_upload(self._fs, bucket, key)
        try:
            for start in range(0, total, self.block_size):
                chunk = span(buffers, start, min(start + self.block_size, total))
                await gcsfs.core.upload_chunk(self._fs, session, chunk, start, total, "application/octet-stream")
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: the original error matters more
                await self._fs._call("DELETE", session)  # cancel the session: no object appears
            raise

    def _write_exclusive_blocking(self, location: str, buffers: list[memoryview]) -> None:
        path = self._path(location)
        data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
        try:
            # ifGenerationMatch=0: GCS refuses (412 -> FileExistsError) if the object exists.
            self._fs.pipe_file(path, data, mode="create")
        finally:
            self._fs.invalidate_cache(path)

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        await self._run("create", location, self._write_exclusive_blocking, location, as_buffers(data))
