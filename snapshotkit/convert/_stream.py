"""Copying stored pieces into a file at their offsets, within the memory budget.

A :class:`Span` is one stored piece and how its bytes reach the file: contiguously from an offset
(a raw tensor's piece), or as the runs of consecutive elements a box of a sharded tensor covers in
the global tensor. :func:`copy_pieces` copies spans in order through the restore pipeline
(:mod:`snapshotkit._restore.fetch`: ranged reads, every checksum verified), double-buffered: a
window of pieces is read straight into one of two reused buffers while a thread writes the
previous window out of the other, and the disk is asked to start writing each window back at
once, so that the final ``fsync`` has little left to wait for. A piece larger than a buffer is
streamed alone in sub-ranges with a running checksum. At most the memory budget is held.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import Piece, ShardedTensorEntry, TensorEntry
from snapshotkit._format.sharded import Box, piece_boxes
from snapshotkit._restore.fetch import PieceRead
from snapshotkit._runtime.filewrite import pwrite_all, start_writeback
from snapshotkit.convert._export_source import Source

#: ``consume(offset within the piece, bytes)``: writes verified bytes of a piece out.
PieceConsumer = Callable[[int, memoryview], None]
#: The largest window: larger ones only delay the first write and the last.
MAX_WINDOW_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Span:
    """A stored piece and how its bytes reach the file: ``write(offset within the piece, bytes)``."""

    piece: Piece
    logical_path: str
    itemsize: int
    write: PieceConsumer


def copy_pieces(source: Source, fd: int, spans: Sequence[Span]) -> None:
    """Copy the pieces of ``spans`` into the file ``fd`` within the memory budget, double-buffered.

    Two buffers of a little under half the budget each (the rest is left to the gaps of merged
    reads) are allocated once and reused: a window of consecutive pieces is read straight into
    one (every checksum verified) while a background thread writes the previous window out of
    the other. A piece larger than a buffer is streamed alone, in budget-sized sub-ranges with a
    running checksum.
    """
    budget_bytes = source.config.memory_budget_bytes
    gaps_bytes = max(budget_bytes // 8, 1)
    window_bytes = max(min((budget_bytes - gaps_bytes) // 2, MAX_WINDOW_BYTES), 1)
    buffers: list[memoryview] = []
    windows = 0
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshotkit-export-write") as writer:
        pending: concurrent.futures.Future[None] | None = None
        for group in _windows(spans, window_bytes):
            if group[0].piece.nbytes > window_bytes:
                if pending is not None:
                    pending.result()
                    pending = None
                span = group[0]
                read = PieceRead(
                    span.piece, span.logical_path, consume=span.write, splittable=True, itemsize=span.itemsize
                )
                # The window buffers stay allocated: the sub-ranges get what the budget has left.
                source.read([read], budget_bytes=budget_bytes - sum(buffer.nbytes for buffer in buffers))
                continue
            if len(buffers) < 2:
                buffers.append(memoryview(bytearray(min(window_bytes, sum(s.piece.nbytes for s in spans)))))
            buffer = buffers[windows % 2]
            windows += 1
            placed: list[tuple[Span, int]] = []
            reads: list[PieceRead] = []
            position = 0
            for span in group:
                placed.append((span, position))
                view = buffer[position : position + span.piece.nbytes]
                reads.append(PieceRead(span.piece, span.logical_path, direct=view))
                position += span.piece.nbytes
            source.read(reads, budget_bytes=gaps_bytes)
            if pending is not None:
                pending.result()  # the other buffer is written out: it can be read into next
            pending = writer.submit(_write_window, fd, buffer, placed)
        if pending is not None:
            pending.result()


def _windows(spans: Sequence[Span], window_bytes: int) -> Iterator[list[Span]]:
    """Consecutive spans of at most ``window_bytes`` together; a larger one alone."""
    group: list[Span] = []
    size = 0
    for span in spans:
        if group and size + span.piece.nbytes > window_bytes:
            yield group
            group, size = [], 0
        group.append(span)
        size += span.piece.nbytes
    if group:
        yield group


def _write_window(fd: int, buffer: memoryview, placed: Sequence[tuple[Span, int]]) -> None:
    """Write out a window (the pieces read into ``buffer``, each at its position there), then
    start the disk writing it back, so that the final ``fsync`` finds little left to wait for."""
    for span, position in placed:
        span.write(0, buffer[position : position + span.piece.nbytes])
    start_writeback(fd)


def contiguous_writer(fd: int, start: int) -> PieceConsumer:
    def consume(within: int, data: memoryview) -> None:
        pwrite_all(fd, data, start + within)

    return consume


def box_writer(fd: int, start: int, shape: tuple[int, ...], box: Box, itemsize: int) -> PieceConsumer:
    """Writes elements of ``box`` (row-major, from any element on) where they sit in the global tensor."""

    def consume(within: int, data: memoryview) -> None:
        first = within // itemsize
        position = 0
        for global_element, count in box_runs(shape, box, first, first + data.nbytes // itemsize):
            nbytes = count * itemsize
            pwrite_all(fd, data[position : position + nbytes], start + global_element * itemsize)
            position += nbytes

    return consume


def box_runs(shape: Sequence[int], box: Box, first: int, stop: int) -> Iterator[tuple[int, int]]:
    """``(global element index, count)`` of the runs of consecutive global elements that elements
    ``[first, stop)`` of ``box`` (counted row-major within the box) occupy in a tensor of ``shape``.

    Dimensions after ``split`` span the whole tensor, so a run is ``prod(box.sizes[split:])``
    elements: the whole box when it cuts only dim 0, one row of the last dimension when it cuts
    that one too.
    """
    ndim = len(shape)
    split = ndim - 1
    while split > 0 and box.sizes[split] == shape[split]:
        split -= 1
    strides = [math.prod(shape[d + 1 :]) for d in range(ndim)]
    run = math.prod(box.sizes[split:]) if ndim else 1
    index = first
    while index < stop:
        number, within = divmod(index, run)
        base = box.offsets[split] * strides[split] if ndim else 0
        for d in range(split - 1, -1, -1):  # the run's position in dims before ``split``
            number, coordinate = divmod(number, box.sizes[d])
            base += (box.offsets[d] + coordinate) * strides[d]
        count = min(run - within, stop - index)
        yield base + within, count
        index += count


def spans(fd: int, start: int, logical_path: str, entry: TensorEntry | ShardedTensorEntry) -> Iterator[Span]:
    """The pieces of a raw or sharded tensor whose row-major bytes start at ``start`` of the file ``fd``."""
    itemsize, path = RAW_ITEMSIZE[entry.dtype], logical_path
    if isinstance(entry, TensorEntry):
        offset = 0
        for piece in entry.pieces:
            yield Span(piece, path, itemsize, contiguous_writer(fd, start + offset))
            offset += piece.nbytes
        return
    for shard in entry.shards:
        sizes = [piece.nbytes for piece in shard.pieces]
        for piece, box in zip(shard.pieces, piece_boxes(Box(shard.offsets, shard.sizes), sizes, itemsize), strict=True):
            yield Span(piece, path, itemsize, box_writer(fd, start, entry.shape, box, itemsize))
