"""In-place runs: many plain tensors read straight into their destinations without an object per tensor.

Planning a restore from a version-5 manifest's columns (:mod:`.columns`) hands the loader one
:class:`InPlaceRun` for all the plain one-piece tensors of an app_state key whose destinations
passed every check: column arrays (data object, start, length, CRC-32C) and, per tensor, its
logical path, destination and memory address. :func:`read_runs` fetches them as
:func:`~.fetch.read_pieces` fetches direct reads: pieces of one data object that follow each
other (gaps of at most :data:`MAX_GAP_BYTES`, under the memory budget) are one ranged read into
the destinations' memory, each piece is checked against its CRC-32C once read (a mismatch is a
:class:`~snapshotkit.errors.ChecksumMismatchError` naming the logical path, and the restore
fails), with batches grouped and checked by numpy rather than per piece in Python.

IMPORTANT: a run's destinations are read into through raw memory views: the run holds a
reference to each destination tensor for as long as it may be read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from snapshotkit._format.checksum import crc32c_each
from snapshotkit._format.entries import Piece
from snapshotkit._format.serialization import memory_view
from snapshotkit._plan.reads import MAX_GAP_BYTES
from snapshotkit._restore.failures import storage_failure
from snapshotkit._restore.fetch import MAX_BATCH_BYTES, PieceRead, storage_object_failure, verify_read
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import gather_or_cancel, to_thread
from snapshotkit.errors import UnsafeStorageObjectError
from snapshotkit.storage import StoragePlugin


@dataclasses.dataclass(frozen=True)
class InPlaceRun:
    """Tensors to read in place, one piece each, as arrays (index ``i`` is one tensor).

    Attributes:
        paths: the logical paths.
        destinations: the destination tensors (plain, contiguous, CPU, non-empty, of the
            stored dtype and shape, each its own memory).
        addresses: ``data_ptr()`` of each destination.
        location: index into ``locations`` of each piece's data object.
        start: each piece's first byte in its data object.
        length: each piece's bytes (the destination's ``nbytes``).
        checksum: each piece's CRC-32C.
        locations: the data objects, as addresses the storage plugin reads.
        piece_at: builds the manifest's :class:`Piece` of tensor ``i`` (for messages and for
            entries that meet the same memory later).
    """

    paths: list[str]
    destinations: list[torch.Tensor]
    addresses: np.ndarray
    location: np.ndarray
    start: np.ndarray
    length: np.ndarray
    checksum: np.ndarray
    locations: list[str]
    piece_at: Callable[[int], Piece]

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def index_of(self, address: int) -> int | None:
        """The tensor whose destination starts at ``address``, or None."""
        order = self._by_address
        k = int(np.searchsorted(self.addresses, address, sorter=order))
        return int(order[k]) if k < len(order) and int(self.addresses[order[k]]) == address else None

    @functools.cached_property
    def _by_address(self) -> np.ndarray:
        return np.argsort(self.addresses, kind="stable")


def run_holding(runs: Sequence[InPlaceRun], address: int) -> tuple[str, tuple[InPlaceRun, int]] | None:
    """``(logical path, (run, index))`` of the tensor of ``runs`` whose destination starts at the
    CPU ``address``, or None."""
    for run in runs:
        i = run.index_of(address)
        if i is not None:
            return run.paths[i], (run, i)
    return None


@dataclasses.dataclass(frozen=True)
class _Batch:
    """One ranged read ``[start, end)`` of ``location`` that fills tensors ``members`` of ``run``
    (in byte order), with ``gap_bytes`` between them in all and ``max_gap`` the largest gap."""

    run: InPlaceRun
    location: str
    start: int
    end: int
    members: np.ndarray
    gap_bytes: int
    max_gap: int


def _batches(run: InPlaceRun, max_batch_bytes: int) -> list[_Batch]:
    """The ranged reads for ``run``: pieces of one data object merged while the gap between two
    is at most :data:`MAX_GAP_BYTES` and the read stays within ``max_batch_bytes`` (a larger
    piece is a read of its own); overlapping pieces are never in one read."""
    order = np.lexsort((run.start, run.location))
    location, start = run.location[order], run.start[order]
    end = start + run.length[order]
    cut = np.ones(len(order), dtype=bool)
    cut[1:] = (location[1:] != location[:-1]) | (start[1:] < end[:-1]) | (start[1:] > end[:-1] + MAX_GAP_BYTES)
    bounds = [*np.flatnonzero(cut).tolist(), len(order)]
    batches: list[_Batch] = []
    for low, high in itertools.pairwise(bounds):
        i = low
        while i < high:  # ends increase within a segment: the first piece past the size limit by bisection
            j = max(i + 1, i + int(np.searchsorted(end[i:high], int(start[i]) + max_batch_bytes, "right")))
            gaps = start[i + 1 : j] - end[i : j - 1]
            batches.append(
                _Batch(
                    run,
                    run.locations[int(location[i])],
                    int(start[i]),
                    int(end[j - 1]),
                    order[i:j],
                    int(gaps.sum()),
                    int(gaps.max()) if len(gaps) else 0,
                )
            )
            i = j
    return batches


def _joined(runs: Sequence[InPlaceRun]) -> InPlaceRun:
    """``runs`` (one per app_state key) as one run, so that their pieces share ranged reads."""
    if len(runs) == 1:
        return runs[0]
    where: dict[str, int] = {}
    location = []
    for run in runs:  # the runs' location tables, merged
        codes = np.array([where.setdefault(name, len(where)) for name in run.locations], dtype=np.int64)
        location.append(codes[run.location] if len(codes) else run.location)
    locations = list(where)
    firsts = np.cumsum([0, *(len(run.paths) for run in runs)])

    def piece_at(i: int) -> Piece:
        k = int(np.searchsorted(firsts, i, "right")) - 1
        return runs[k].piece_at(i - int(firsts[k]))

    return InPlaceRun(
        [path for run in runs for path in run.paths],
        [tensor for run in runs for tensor in run.destinations],
        np.concatenate([run.addresses for run in runs]),
        np.concatenate(location),
        np.concatenate([run.start for run in runs]),
        np.concatenate([run.length for run in runs]),
        np.concatenate([run.checksum for run in runs]),
        locations,
        piece_at,
    )


def _check(batch: _Batch, views: Sequence[memoryview]) -> None:
    """Every piece of ``batch`` against its CRC-32C; the first mismatch raises, naming its path."""
    run, members = batch.run, batch.members
    got = np.array(crc32c_each(views), dtype=np.uint32)
    bad = np.flatnonzero(got != run.checksum[members])
    if len(bad):
        i, k = int(members[bad[0]]), int(bad[0])
        verify_read(PieceRead(run.piece_at(i), run.paths[i], views[k]), views[k])  # raises
        raise AssertionError("unreachable: a checksum mismatch was verified as a match")


def _views(addresses: np.ndarray, lengths: np.ndarray) -> list[memoryview]:
    """A writable memoryview of each ``[address, address + length)``: slices of one view over the
    span from the lowest address to the highest end (slicing costs a fraction of making a view).
    IMPORTANT: only the slices are read or written; the rest of the span may not be memory at all."""
    low = int(addresses.min())
    span = memory_view(low, int((addresses + lengths).max()) - low)
    offsets = (addresses - low).tolist()
    return [span[o : o + n] for o, n in zip(offsets, lengths.tolist(), strict=True)]


async def _read_batch(
    plugin: StoragePlugin,
    batch: _Batch,
    budget: MemoryBudget,
    io_slots: asyncio.Semaphore,
    verify: bool,
    on_bytes: Callable[[int], None] | None,
) -> None:
    run, members = batch.run, batch.members
    async with budget.reserve(batch.max_gap):  # the gaps are read into one scratch buffer, then dropped
        views = _views(run.addresses[members], run.length[members])
        buffers = views
        if batch.gap_bytes:
            sink = memoryview(bytearray(batch.max_gap))
            starts, lengths = run.start[members].tolist(), run.length[members].tolist()
            buffers = [views[0]]
            for k in range(1, len(views)):
                gap = starts[k] - starts[k - 1] - lengths[k - 1]
                if gap:
                    buffers.append(sink[:gap])
                buffers.append(views[k])
        try:
            async with io_slots:
                await plugin.read_into(batch.location, batch.start, buffers)
        except (EOFError, FileNotFoundError, UnsafeStorageObjectError) as exc:
            paths = [run.paths[i] for i in members.tolist()]
            raise storage_object_failure(exc, batch.location, paths) from exc
        except Exception as exc:
            paths = [run.paths[i] for i in members.tolist()]
            raise storage_failure(exc, location=batch.location, logical_paths=paths)  # noqa: B904
        if verify:
            await to_thread(_check, batch, views)
        if on_bytes is not None:
            on_bytes(batch.end - batch.start - batch.gap_bytes)


async def read_runs(
    plugin: StoragePlugin,
    runs: Sequence[InPlaceRun],
    *,
    budget: MemoryBudget,
    io_concurrency: int,
    verify: bool,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Fetch every tensor of ``runs`` into its destination (module docstring); the bytes read
    from storage (the merged ranges, gaps included)."""
    max_batch_bytes = max(1, min(MAX_BATCH_BYTES, budget.total_bytes))
    batches = _batches(_joined(runs), max_batch_bytes) if runs else []
    io_slots = asyncio.Semaphore(io_concurrency)
    admitted = asyncio.Semaphore(2 * io_concurrency)

    async def admitted_batch(batch: _Batch) -> None:
        async with admitted:
            await _read_batch(plugin, batch, budget, io_slots, verify, on_bytes)

    await gather_or_cancel([admitted_batch(batch) for batch in batches])
    return sum(batch.end - batch.start for batch in batches)
