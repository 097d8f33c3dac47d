"""The read pipeline: fetch pieces by byte range into their destinations, verify, hand over.

A piece lands either *directly* in its destination's memory (a contiguous CPU tensor: no extra
host memory at all) or in a *bounce* buffer that a consumer then copies out (strided or GPU
destinations, serialized objects). Bounce buffers and the gaps between merged ranges are what
the memory budget limits; a raw piece larger than the budget is fetched in budget-sized
sub-ranges with a running checksum.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Sequence

from snapshotkit._format.checksum import crc32c, format_checksum, parse_checksum
from snapshotkit._format.entries import Piece
from snapshotkit._plan.reads import RangeRequest, ReadBatch, plan_read_batches
from snapshotkit._restore.bases import check_referenced
from snapshotkit._restore.failures import storage_failure
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import gather_or_cancel, to_thread
from snapshotkit._text import describe_paths
from snapshotkit.errors import (
    Advice,
    ChecksumMismatchError,
    IntegrityError,
    TruncatedDataError,
    UnsafeStorageObjectError,
)
from snapshotkit.storage import ByteRange, StoragePlugin

#: Largest merged read; big enough to amortise requests, small enough to keep several in flight.
MAX_BATCH_BYTES = 32 << 20
#: Smallest sub-range a large piece is fetched in, whatever the budget: below this, per-request
#: overhead dominates; a budget smaller than this lets one sub-range run alone.
MIN_SUBRANGE_BYTES = 4096


@dataclasses.dataclass(slots=True)
class PieceRead:
    """One piece to fetch for ``logical_path``.

    Exactly one of ``direct`` (destination bytes, ``piece.nbytes`` long) and ``consume`` is set.
    ``consume(offset, data)`` receives verified bytes starting at ``offset`` within the piece;
    it is called once with the whole piece unless ``splittable``, in which case it may be called
    for consecutive sub-ranges whose lengths are multiples of ``itemsize``.
    """

    piece: Piece
    logical_path: str
    direct: memoryview | None = None
    consume: Callable[[int, memoryview], None] | None = None
    splittable: bool = False
    itemsize: int = 1


@dataclasses.dataclass(frozen=True)
class Claim:
    """A piece the restore reads into memory it allocates itself (a new tensor or a buffer).

    Before allocating, the engine proves the data object really holds the piece
    (:func:`check_extents`), so a manifest cannot make a restore
    allocate memory for bytes that do not exist.
    """

    logical_path: str
    piece: Piece
    fresh_tensor: bool


def verify_read(read: PieceRead, data: memoryview, running: int = 0, *, final: bool = True) -> int:
    value = crc32c(data, running)
    if final and value != parse_checksum(read.piece.checksum):
        problem = (
            f"checksum mismatch for logical path {read.logical_path!r}: bytes {list(read.piece.byte_range)} of "
            f"data object {read.piece.address!r} have {format_checksum(value)}, the manifest says "
            f"{read.piece.checksum}. The snapshot is corrupt"
        )
        error = ChecksumMismatchError(
            f"{problem}; restore from another snapshot (or pass verify_checksums=False to read it anyway)"
        )
        raise error.advised(Advice(problem, "restore_another"))
    return value


def storage_object_failure(exc: BaseException, location: str, logical_paths: Iterable[str]) -> IntegrityError:
    shown = describe_paths(logical_paths)
    if isinstance(exc, FileNotFoundError):
        return IntegrityError(
            f"data object {location!r} holding {shown} is missing; the snapshot is damaged. "
            "Restore from another snapshot"
        )
    if isinstance(exc, UnsafeStorageObjectError):
        return IntegrityError(f"data object {location!r} holding {shown} was refused: {exc}")
    return TruncatedDataError(
        f"data object {location!r} holding {shown} is shorter than the manifest says ({exc}); "
        "the snapshot is truncated. Restore from another snapshot"
    )


async def _run_batch(
    plugin: StoragePlugin,
    batch: ReadBatch,
    reads: Sequence[PieceRead],
    budget: MemoryBudget,
    io_slots: asyncio.Semaphore,
    verify: bool,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    bounce_bytes = sum(r.end - r.start for r in batch.requests if reads[r.tag].direct is None)
    gap_bytes = batch.nbytes - sum(r.end - r.start for r in batch.requests)
    async with budget.reserve(bounce_bytes + gap_bytes):
        buffers: list[memoryview] = []
        targets: list[tuple[PieceRead, memoryview]] = []
        position = batch.start
        gap_sink: memoryview | None = None
        for request in batch.requests:
            if request.start > position:
                if gap_sink is None:
                    gap_sink = memoryview(bytearray(max(gap_bytes, 1)))
                buffers.append(gap_sink[: request.start - position])
            read = reads[request.tag]
            target = read.direct if read.direct is not None else memoryview(bytearray(request.end - request.start))
            buffers.append(target)
            targets.append((read, target))
            position = request.end
        try:
            # The I/O slot covers the request only: verifying and copying out must not keep
            # the storage queue shallower than io_concurrency.
            async with io_slots:
                await plugin.read_into(batch.location, batch.start, buffers)
        except (EOFError, FileNotFoundError, UnsafeStorageObjectError) as exc:
            raise storage_object_failure(
                exc, batch.location, [reads[r.tag].logical_path for r in batch.requests]
            ) from exc
        except Exception as exc:
            paths = [reads[r.tag].logical_path for r in batch.requests]
            raise storage_failure(exc, location=batch.location, logical_paths=paths)  # noqa: B904

        def finish() -> None:
            for read, data in targets:
                if verify and crc32c(data) != parse_checksum(read.piece.checksum):
                    verify_read(read, data)  # raises, naming the logical path
                if read.consume is not None:
                    read.consume(0, data)

        await to_thread(finish)
        if on_bytes is not None:
            on_bytes(batch.nbytes - gap_bytes)


async def _run_streamed(
    plugin: StoragePlugin,
    read: PieceRead,
    budget: MemoryBudget,
    io_slots: asyncio.Semaphore,
    verify: bool,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Fetch one large bounce piece in budget-sized sub-ranges, checksumming as it goes."""
    assert read.consume is not None
    start, end = read.piece.byte_range
    size = max(budget.total_bytes, MIN_SUBRANGE_BYTES)
    step = max(read.itemsize, size - size % read.itemsize)
    running = 0
    for offset in range(start, end, step):
        length = min(step, end - offset)
        async with budget.reserve(length):
            data = memoryview(bytearray(length))
            try:
                async with io_slots:
                    await plugin.read_into(read.piece.address, offset, [data])
            except (EOFError, FileNotFoundError, UnsafeStorageObjectError) as exc:
                raise storage_object_failure(exc, read.piece.address, [read.logical_path]) from exc
            except Exception as exc:
                location = read.piece.address
                raise storage_failure(exc, location=location, logical_paths=[read.logical_path])  # noqa: B904

            def finish(
                data: memoryview = data, offset: int = offset, length: int = length, running: int = running
            ) -> int:
                value = verify_read(read, data, running, final=offset + length == end) if verify else 0
                assert read.consume is not None
                read.consume(offset - start, data)
                return value

            running = await to_thread(finish)
            if on_bytes is not None:
                on_bytes(length)


async def check_extents(plugin: StoragePlugin, claims: Iterable[Claim], *, io_concurrency: int) -> int:
    """Prove that every data object is as long as the claims on it say, reading one byte at the
    furthest claimed end of each: a manifest cannot make a restore allocate memory for bytes
    that are not there. Returns the bytes read (one per data object probed).

    Raises:
        TruncatedDataError: a data object ends before a claimed piece does.
        IntegrityError: a claimed data object is missing.
    """
    claims = list(claims)
    await check_referenced(plugin, ((claim.piece, claim.logical_path) for claim in claims))
    furthest: dict[str, int] = {}
    paths: dict[str, set[str]] = {}
    for claim in claims:
        location, end = claim.piece.address, claim.piece.byte_range[1]
        furthest[location] = max(furthest.get(location, 0), end)
        paths.setdefault(location, set()).add(claim.logical_path)
    slots = asyncio.Semaphore(io_concurrency)

    async def probe(location: str, end: int) -> None:
        try:
            async with slots:
                data = await plugin.read(location, ByteRange(end - 1, end))
        except (EOFError, FileNotFoundError, UnsafeStorageObjectError) as exc:
            raise storage_object_failure(exc, location, paths[location]) from exc
        except Exception as exc:
            raise storage_failure(exc, location=location, logical_paths=sorted(paths[location]))  # noqa: B904
        if len(data) != 1:
            raise storage_object_failure(EOFError(f"byte {end - 1} is past the end"), location, paths[location])

    probes = [probe(location, end) for location, end in furthest.items() if end > 0]
    await gather_or_cancel(probes)
    return len(probes)


async def read_pieces(
    plugin: StoragePlugin,
    reads: Sequence[PieceRead],
    *,
    budget: MemoryBudget,
    io_concurrency: int,
    verify: bool,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Fetch every piece in ``reads`` into its destination, merging nearby ranges.

    ``on_bytes(n)`` is called (on the loop) as each batch or sub-range is verified and handed
    over, with the bytes of the pieces in it (gaps not counted): the calls sum to the pieces' bytes.

    Returns the bytes read from storage: the merged ranges (with the small gaps between their
    pieces) and the pieces fetched in sub-ranges.
    """
    await check_referenced(plugin, ((read.piece, read.logical_path) for read in reads))
    threshold = max(budget.total_bytes, MIN_SUBRANGE_BYTES)
    # One pass, no per-read method calls: a restore of many small tensors has a read per tensor.
    streamed: list[PieceRead] = []
    empty: list[PieceRead] = []
    requests: list[RangeRequest] = []
    for index, read in enumerate(reads):
        piece = read.piece
        start, end = piece.byte_range
        if read.direct is None and read.splittable and end - start > threshold:
            streamed.append(read)
        elif end > start:
            requests.append(RangeRequest(piece.address, start, end, index))
        else:
            empty.append(read)
    max_batch_bytes = max(1, min(MAX_BATCH_BYTES, budget.total_bytes))
    batches = plan_read_batches(requests, max_batch_bytes=max_batch_bytes)
    io_slots = asyncio.Semaphore(io_concurrency)
    # At most two batches per I/O slot wait in line or are being verified, so bounce buffers
    # are not all allocated up front (the budget limits them too).
    admitted = asyncio.Semaphore(2 * io_concurrency)

    async def admitted_batch(batch: ReadBatch) -> None:
        async with admitted:
            await _run_batch(plugin, batch, reads, budget, io_slots, verify, on_bytes)

    async def admitted_stream(read: PieceRead) -> None:
        async with admitted:
            await _run_streamed(plugin, read, budget, io_slots, verify, on_bytes)

    for read in empty:
        if verify:
            verify_read(read, memoryview(b""))
        if read.consume is not None:
            read.consume(0, memoryview(b""))
    await gather_or_cancel([*(admitted_batch(b) for b in batches), *(admitted_stream(r) for r in streamed)])
    return sum(batch.nbytes for batch in batches) + sum(read.piece.nbytes for read in streamed)


def union_bytes(pieces: Iterable[Piece]) -> int:
    """Bytes covered by the union of the pieces' ranges, per data object; a reference to a base's
    piece counts each time it is used (an incremental take references one base piece for every
    piece of its bytes, so equal pieces of a new snapshot legitimately share it)."""
    by_location: dict[str, list[tuple[int, int]]] = {}
    total = 0
    for piece in pieces:
        if piece.base is not None:
            total += piece.nbytes
        else:
            by_location.setdefault(piece.address, []).append(piece.byte_range)
    for ranges in by_location.values():
        covered_to = 0
        for start, end in sorted(ranges):
            start = max(start, covered_to)
            if end > start:
                total += end - start
                covered_to = end
    return total
