"""Which stored boxes of a sharded tensor overlap a wanted box, without scanning them all.

A restore onto thousands of ranks asks, for each destination box, which of the tensor's
thousands of stored boxes it overlaps. :class:`BoxIndex` sorts the stored boxes once by their
offset along the dim where they are most spread, and answers each question with two bisections
and an overlap check of the candidates in between: O(log n + k) for boxes of similar sizes.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from snapshotkit._format.sharded import Box

#: Fewer stored boxes than this are scanned: sorting them costs more than it saves.
_SCAN_BELOW = 16


class BoxLike(Protocol):
    """A box: a :class:`~snapshotkit._format.sharded.Box`, or a stored shard (no copy needed)."""

    @property
    def offsets(self) -> tuple[int, ...]: ...

    @property
    def sizes(self) -> tuple[int, ...]: ...


def _overlaps(a: BoxLike, b: Box) -> bool:
    return all(
        max(ao, bo) < min(ao + an, bo + bn)
        for ao, an, bo, bn in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def _size(extent: tuple[int, int]) -> int:
    return extent[1]


class BoxIndex:
    """The stored boxes of one tensor, indexed for :meth:`overlapping` queries."""

    __slots__ = ("_boxes", "_dim", "_order", "_reach", "_starts")

    def __init__(self, boxes: Sequence[BoxLike]) -> None:
        self._boxes = boxes
        self._dim = -1  # scan
        self._order: list[int] = []
        self._starts: list[int] = []
        self._reach = 0
        if len(boxes) < _SCAN_BELOW or not boxes[0].offsets:
            return
        ndim = len(boxes[0].offsets)
        # The dim along which the boxes are most spread separates them best (dim 0 for Shard(0),
        # dim 1 for Shard(1)), judged on an even sample: every full pass over the boxes costs
        # (their objects lie all over a large decoded manifest), so the build makes one.
        sample = boxes[:: max(1, len(boxes) // 64)]
        spread = [len({box.offsets[d] for box in sample}) for d in range(ndim)]
        dim = max(range(ndim), key=spread.__getitem__)
        extents = [(box.offsets[dim], box.sizes[dim]) for box in boxes]
        self._order = sorted(range(len(boxes)), key=extents.__getitem__)
        self._starts = [extents[i][0] for i in self._order]
        # A box starting more than the largest extent before a wanted box ends before it.
        self._reach = max(extents, key=_size)[1]
        self._dim = dim

    def overlapping(self, wanted: Box) -> list[int]:
        """Indices (into the boxes given, ascending) of the stored boxes that overlap ``wanted``."""
        if self._dim < 0:
            return [i for i, box in enumerate(self._boxes) if _overlaps(box, wanted)]
        low = wanted.offsets[self._dim] - self._reach + 1  # a box starting below this ends before wanted
        high = wanted.offsets[self._dim] + wanted.sizes[self._dim]  # one starting at or past this begins after
        first, last = bisect.bisect_left(self._starts, low), bisect.bisect_left(self._starts, high)
        boxes = self._boxes
        found = [i for i in self._order[first:last] if _overlaps(boxes[i], wanted)]
        found.sort()
        return found
