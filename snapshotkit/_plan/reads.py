"""Pure planning of reads: which ranged reads fetch the byte ranges a restore wants.

Pieces wanted from one data object are merged into one ranged read when they are close
together, so restoring thousands of small tensors costs a handful of requests. Nothing here
does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

#: Largest gap between two requests that one ranged read spans (the gap's bytes are read and dropped).
MAX_GAP_BYTES = 4096


class RangeRequest(NamedTuple):
    """A wanted byte range ``[start, end)`` of ``location``; ``tag`` lets the caller find it again.

    A named tuple, not a frozen dataclass: a restore of many small tensors makes one per piece,
    and a tuple is built and sorted several times faster (its natural order is the read order).
    """

    location: str
    start: int
    end: int
    tag: int


@dataclasses.dataclass(frozen=True)
class ReadBatch:
    """One ranged read ``[start, end)`` of ``location`` that serves ``requests`` (sorted, disjoint)."""

    location: str
    start: int
    end: int
    requests: tuple[RangeRequest, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def plan_read_batches(
    requests: Sequence[RangeRequest],
    *,
    max_batch_bytes: int,
    max_gap_bytes: int = MAX_GAP_BYTES,
) -> list[ReadBatch]:
    """Merge requests on the same object into ranged reads.

    Two requests share a read when the gap between them is at most ``max_gap_bytes`` and the
    merged read stays within ``max_batch_bytes``. A request larger than ``max_batch_bytes`` is a
    read of its own. Overlapping requests (the same piece wanted twice) are never merged, so
    every request maps to a distinct byte range of its batch.
    """
    batches: list[ReadBatch] = []
    ordered = sorted(requests)  # by (location, start, end, tag): the fields in order
    group: list[RangeRequest] = []
    for request in ordered:
        if group:
            last = group[-1]
            if (
                request.location == last.location
                and last.end <= request.start <= last.end + max_gap_bytes
                and request.end - group[0].start <= max_batch_bytes
            ):
                group.append(request)
                continue
            batches.append(ReadBatch(group[0].location, group[0].start, group[-1].end, tuple(group)))
        group = [request]
    if group:
        batches.append(ReadBatch(group[0].location, group[0].start, group[-1].end, tuple(group)))
    return batches
