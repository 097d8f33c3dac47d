"""Pure planning of the write layout: where every stored byte goes.

Nothing here does I/O or talks to a process group, so the same inputs give the same plan on
every rank, and every rule is unit-testable.

Write layout: each *payload* (the bytes of one tensor or serialized object) is cut into pieces
of at most ``chunk_bytes`` (on element boundaries), and pieces are packed in order into data
objects of about ``data_object_bytes``, each piece starting at a multiple of ``alignment``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

#: Every piece starts at a multiple of this many bytes within its data object.
ALIGNMENT_BYTES = 64


@dataclasses.dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of a payload (``0 <= start <= end``)."""

    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class PayloadSpan:
    """Bytes ``[start, end)`` of payload ``payload``: a piece waiting for a place in a data object."""

    payload: int
    start: int
    end: int

    @classmethod
    def of(cls, payload: int, span: Span) -> PayloadSpan:
        return cls(payload, span.start, span.end)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class PieceSlot:
    """Bytes ``[start, end)`` of payload ``payload`` stored at ``offset`` in the ``object_index``-th data
    object of its plan.

    The data object is named by its index, not its location: a location embeds the take's id, and
    a plan reused by a later take (:mod:`snapshotkit._take.plan_cache`) keeps its slots unchanged.
    """

    payload: int
    start: int
    end: int
    object_index: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class DataObjectPlan:
    """One data object: its location, the pieces in it (by offset) and its size in bytes."""

    location: str
    slots: tuple[PieceSlot, ...]
    nbytes: int


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """What :func:`pack_pieces` decided.

    Attributes:
        data_objects: the data objects, in write order.
        slots: one slot per piece, in the order the pieces were given.
    """

    data_objects: tuple[DataObjectPlan, ...]
    slots: tuple[PieceSlot, ...]


def data_object_location(rank: int, index: int, take_id: str) -> str:
    """Location of a rank's ``index``-th data object in the take ``take_id``.

    The take id keeps two takes aimed at the same path (a mistake, but one that happens) from
    writing over each other's data objects before one of them fails to commit.
    """
    return f"data/{rank}_{index:05d}_{take_id}"


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def split_payload(nbytes: int, itemsize: int, chunk_bytes: int) -> list[Span]:
    """Spans of at most ``chunk_bytes`` (at least one element) covering ``[0, nbytes)``, in order.

    Every span but the last holds a whole number of elements, so each piece starts on an
    element boundary; an empty payload has no spans.
    """
    if nbytes <= chunk_bytes:
        return [Span(0, nbytes)] if nbytes else []
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    return [Span(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def row_pieces(shape: Sequence[int], itemsize: int, chunk_bytes: int) -> list[Span]:
    """Spans of whole dim-0 rows covering a contiguous tensor of ``shape``, in order: each piece of
    a sharded tensor is then a box of it.

    A span holds as many rows as fit in ``chunk_bytes``, and at least one (a row larger than
    ``chunk_bytes`` is a span of its own). A 0-d tensor is one span of one element; a tensor
    without elements has no spans.
    """
    if not shape:
        return split_payload(itemsize, itemsize, chunk_bytes)
    row_bytes = itemsize * math.prod(shape[1:])
    nbytes = row_bytes * shape[0]
    if nbytes == 0:
        return []
    rows = max(1, chunk_bytes // row_bytes)
    step = rows * row_bytes
    return [Span(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def pack_pieces(
    pieces: Sequence[PayloadSpan],
    *,
    rank: int,
    take_id: str,
    data_object_bytes: int,
    alignment: int = ALIGNMENT_BYTES,
    first_index: int = 0,
) -> PackedLayout:
    """Pack pieces, in the order given, into data objects of about ``data_object_bytes``.

    Each slot starts at the first multiple of ``alignment`` after the previous slot of its data
    object. A piece that would end past ``data_object_bytes`` starts a new data object, unless
    the current one is empty: a data object exceeds ``data_object_bytes`` only when it holds a
    single piece. Data objects are named :func:`data_object_location` ``(rank, first_index,
    take_id)``, ``(rank, first_index + 1, take_id)``, ... in write order (slots carry the same
    indices); each holds at least one piece.
    """
    return pack_columns(
        [piece.payload for piece in pieces],
        [piece.start for piece in pieces],
        [piece.end for piece in pieces],
        rank=rank,
        take_id=take_id,
        data_object_bytes=data_object_bytes,
        alignment=alignment,
        first_index=first_index,
    )


def pack_columns(
    payloads: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    *,
    rank: int,
    take_id: str,
    data_object_bytes: int,
    alignment: int = ALIGNMENT_BYTES,
    first_index: int = 0,
) -> PackedLayout:
    """:func:`pack_pieces` of the pieces ``[starts[i], ends[i])`` of payload ``payloads[i]``, given
    as three columns: a planner of many small payloads makes no object per piece before its slot."""
    objects: list[DataObjectPlan] = []
    slots: list[PieceSlot] = []
    index = first_index
    opened = 0  # where the current data object's slots begin in ``slots``
    offset = 0
    for payload, start, end in zip(payloads, starts, ends, strict=True):
        nbytes = end - start
        slot_offset = -(-offset // alignment) * alignment
        if slot_offset + nbytes > data_object_bytes and len(slots) > opened:
            objects.append(DataObjectPlan(data_object_location(rank, index, take_id), tuple(slots[opened:]), offset))
            index += 1
            opened = len(slots)
            slot_offset = 0
        slots.append(PieceSlot(payload, start, end, index, slot_offset))
        offset = slot_offset + nbytes
    if len(slots) > opened:
        objects.append(DataObjectPlan(data_object_location(rank, index, take_id), tuple(slots[opened:]), offset))
    return PackedLayout(tuple(objects), tuple(slots))
