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
class PieceSlot:
    """Bytes ``[start, end)`` of payload ``payload`` stored at ``offset`` in data object ``location``."""

    payload: int
    start: int
    end: int
    location: str
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


def data_object_location(rank: int, index: int, take_id: str) -> str:
    """Location of a rank's ``index``-th data object in the take ``take_id``.

    The take id keeps two takes aimed at the same path (a mistake, but one that happens) from
    writing over each other's data objects before one of them fails to commit.
    """
    return f"data/{rank}_{index:05d}_{take_id}"


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def split_payload(nbytes: int, itemsize: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of at most ``chunk_bytes`` (at least one element) covering ``[0, nbytes)``."""
    if nbytes <= chunk_bytes:
        return [(0, nbytes)] if nbytes else []
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def row_pieces(shape: Sequence[int], itemsize: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of whole dim-0 rows, at most ``chunk_bytes`` each (at least one row), covering a
    contiguous tensor of ``shape``: each piece of a sharded tensor is then a box of it."""
    if not shape:
        return split_payload(itemsize, itemsize, chunk_bytes)
    row_bytes = itemsize * math.prod(shape[1:])
    nbytes = row_bytes * shape[0]
    if nbytes == 0:
        return []
    rows = max(1, chunk_bytes // row_bytes)
    step = rows * row_bytes
    return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def pack_pieces(
    pieces: Sequence[tuple[int, int, int]],
    *,
    rank: int,
    take_id: str,
    data_object_bytes: int,
    alignment: int = ALIGNMENT_BYTES,
) -> tuple[list[DataObjectPlan], list[PieceSlot]]:
    """Pack ``(payload, start, end)`` pieces, in order, into data objects of about ``data_object_bytes``.

    Returns the data objects in write order and one slot per piece, in the order given.
    """
    objects: list[DataObjectPlan] = []
    slots: list[PieceSlot] = []
    current: list[PieceSlot] = []
    location = data_object_location(rank, 0, take_id)
    offset = 0

    def close_object() -> None:
        nonlocal current, location, offset
        if current:
            objects.append(DataObjectPlan(location, tuple(current), offset))
            location = data_object_location(rank, len(objects), take_id)
            current = []
            offset = 0

    for payload, start, end in pieces:
        slot_offset = _align_up(offset, alignment)
        if current and slot_offset + (end - start) > data_object_bytes:
            close_object()
            slot_offset = 0
        slot = PieceSlot(payload, start, end, location, slot_offset)
        current.append(slot)
        slots.append(slot)
        offset = slot_offset + (end - start)
    close_object()
    return objects, slots
