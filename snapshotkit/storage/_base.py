"""The storage plugin SPI: a small async interface every backend implements."""

from __future__ import annotations

import abc
import builtins
import contextlib
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from snapshotkit.storage._retry import is_transient_error

if TYPE_CHECKING:
    from typing_extensions import Buffer


@dataclasses.dataclass(frozen=True)
class ByteRange:
    """The half-open byte range ``[start, end)`` of a stored object."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"byte range [{self.start}, {self.end}) needs 0 <= start <= end")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a plugin can do beyond the required methods.

    Attributes:
        atomic_exclusive_write: ``write_exclusive`` cannot race (fs ``link``, S3 ``If-None-Match``).
        atomic_replace: :meth:`~StoragePlugin.replace` is atomic to readers (fs: a temporary file
            renamed over the object; object stores: one PUT or upload): a reader, and a crash at
            any instant, sees the old object whole or the new one whole.
        listing: ``list`` is implemented.
        zero_copy_read_into: ``read_into`` fills caller buffers without an intermediate copy.
        own_retries: the plugin (or its client library) already retries transient failures of
            each request; snapshotkit's retry layer then passes its calls through untouched, so
            attempts never multiply (GCS: gcsfs retries).
        directories: the store has real directories, which can exist empty (a file system):
            ``list_dirs`` names empty ones too and ``remove_empty_dirs`` removes them.
        host_page_cache: reads are served through this host's kernel page cache (a file
            system): ranks on one host reading the same bytes cost the store one read, so a
            restore does not share replicated reads among them by default.
        process_local: the objects live in the memory of the process that wrote them
            (``memory://``): another process opening the same URI sees a different, empty store.
            Writes that another process would do are refused before anything is written:
            ``async_take(executor="process")`` (its checkpoint daemon) and takes by more than
            one rank.
    """

    atomic_exclusive_write: bool = False
    atomic_replace: bool = False
    listing: bool = False
    zero_copy_read_into: bool = False
    own_retries: bool = False
    directories: bool = False
    host_page_cache: bool = False
    process_local: bool = False


def as_buffers(data: Buffer | Sequence[Buffer]) -> list[memoryview]:
    """Normalise ``write``'s ``data`` argument to a list of flat byte memoryviews (no copies)."""
    items = [data] if isinstance(data, (bytes, bytearray, memoryview)) or not isinstance(data, Sequence) else data
    views = []
    for item in items:
        view = memoryview(item)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        views.append(view)
    return views


class StoragePlugin(abc.ABC):
    """Where snapshot bytes live. One instance serves one snapshot root (directory or prefix).

    Required: :meth:`write`, :meth:`read`, :meth:`delete`, :meth:`close`. The rest have
    defaults built on those and may be overridden for speed.

    Contract:
        * Locations are relative ``/``-separated paths below the plugin's root.
        * A missing object raises ``FileNotFoundError``.
        * A byte range that reaches past the end of the object (``end > size``, empty ranges
          included) raises ``EOFError``: a short read is an error, never silent truncation.
        * A location that names no object (a "directory" prefix of other objects included) is a
          missing object.
        * ``write`` accepts bytes, bytearrays, memoryviews, or a sequence of them (written back to
          back as one object) and does not copy them more than the backend needs.
        * ``write`` replaces an existing object; :meth:`write_exclusive` never does.
        * After ``write`` returns, the object is durable as far as the backend can promise.
        * ``close`` is idempotent.

    Transient failures (see :meth:`is_transient`) are retried by snapshotkit's retry layer,
    which wraps every plugin it opens: a plugin raises them and need not retry itself.
    """

    #: Set as a class attribute by plugins; wrappers (the retry layer) set it per instance.
    capabilities: Capabilities = Capabilities()

    @abc.abstractmethod
    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        """Store ``data`` (one buffer, or several concatenated) as the object ``location``."""

    @abc.abstractmethod
    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        """Return the bytes of ``location`` (all of it, or ``byte_range``)."""

    @abc.abstractmethod
    async def delete(self, location: str) -> None:
        """Remove ``location``; a missing object raises ``FileNotFoundError``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and other resources; safe to call more than once."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether an operation that raised ``exc`` may succeed when retried.

        The default (:func:`~snapshotkit.storage.is_transient_error`) says yes to connection
        resets, refusals and timeouts and to HTTP 408/429/5xx anywhere in the exception's
        chain. Override it to add your backend's throttling and availability errors; keep
        answers such as ``FileNotFoundError`` and refused credentials non-transient.
        """
        return is_transient_error(exc)

    async def prefetch(self, location: str, byte_range: ByteRange) -> None:
        """A hint that ``byte_range`` of ``location`` will be read soon; optional.

        A restore calls it once the manifest is decoded, before planning, for the ranges it is
        about to read (at most its memory budget's worth), so that a backend can start fetching
        while the restore plans. It must return promptly (start the work, do not wait for it),
        change nothing, and never raise for a missing, unsafe or short object: the reads that
        follow report those. The default does nothing; the file system plugin asks the kernel
        to read ahead (``posix_fadvise(POSIX_FADV_WILLNEED)``).
        """
        del location, byte_range

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` in order with the bytes of ``location`` from offset ``start``.

        The default reads the range and copies it; plugins that can read straight into caller
        memory override this.
        """
        total = sum(b.nbytes for b in buffers)
        data = memoryview(await self.read(location, ByteRange(start, start + total))).cast("B")
        if data.nbytes != total:
            raise EOFError(f"{location}: read {data.nbytes} bytes at offset {start}, wanted {total}")
        offset = 0
        for buffer in buffers:
            buffer.cast("B")[:] = data[offset : offset + buffer.nbytes]
            offset += buffer.nbytes

    async def exists(self, location: str) -> bool:
        """Whether ``location`` exists."""
        try:
            await self.read(location, ByteRange(0, 0))
        except FileNotFoundError:
            return False
        return True

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        """Write ``location`` only if it does not exist (else ``FileExistsError``), durably.

        Used for the commit marker. The default checks then writes, which can race; plugins
        with an atomic primitive override it and set ``capabilities.atomic_exclusive_write``.
        """
        if await self.exists(location):
            raise FileExistsError(location)
        await self.write(location, data)

    async def replace(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        """Write ``location`` over the object there (if any) so that a reader sees the old object
        whole or the new one whole, never a mix nor nothing, durably.

        Used for the commit marker of a take that replaces a snapshot. The default is
        :meth:`write`, which is atomic on object stores (one PUT or upload); plugins whose
        ``write`` is not (a file written in place) override it and set ``capabilities.atomic_replace``.
        """
        await self.write(location, data)

    async def list(self, prefix: str = "") -> list[str]:
        """Locations under ``prefix`` (``""`` for all), sorted."""
        raise NotImplementedError(f"{type(self).__name__} cannot list objects")

    async def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The "directories" directly below ``prefix`` (``""`` or ending in ``/``), sorted, as
        locations without a trailing ``/``: ``list_dirs("run/")`` -> ``["run/step_1", ...]``.

        The default derives them from :meth:`list`; a file system plugin overrides it to name
        empty directories too (an interrupted write can leave one).
        """
        if prefix and not prefix.endswith("/"):
            raise ValueError(f"list_dirs takes '' or a prefix ending in '/', got {prefix!r}")
        found = set()
        for location in await self.list(prefix):
            head, slash, _ = location[len(prefix) :].partition("/")
            if slash:  # an object below a directory, not one directly under the prefix
                found.add(prefix + head)
        return sorted(found)

    async def remove_empty_dirs(self, prefix: str) -> None:
        """Remove the directory ``prefix`` (ending in ``/``) names and the directories below it,
        deepest first, where they hold nothing. A no-op for stores without directories."""
        return None

    async def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``; nothing there is not an error."""
        for location in await self.list(prefix):
            with contextlib.suppress(FileNotFoundError):
                await self.delete(location)

    async def discard(self, locations: Sequence[str]) -> None:
        """Best-effort removal of objects a failed take wrote; missing ones are skipped."""
        for location in locations:
            try:
                await self.delete(location)
            except FileNotFoundError:
                continue
