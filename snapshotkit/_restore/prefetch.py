"""Read-ahead hints: the data-object ranges a restore is about to read, named before it plans.

A cold restore would otherwise pay planning and I/O in series: nothing is read until every
destination is checked. Once the manifest is decoded, :func:`prefetch_ranges` names the byte
ranges of this snapshot's data objects that hold the pieces of the restored keys, and
:func:`prefetch` hands them to the storage plugin's optional
:meth:`~snapshotkit.storage.StoragePlugin.prefetch` hook (the file system plugin asks the kernel
to read ahead), so the storage works while the restore plans.

The hint is bounded by the memory budget: only the first ``memory_budget_bytes`` of the ranges,
in the order the reads will come (data object, then offset). Read-ahead lands in the page cache,
not in this process, but a hint far ahead of the reads could push its own early pages out of a
small cache before they are read, and read them twice; past the first budget's worth the
kernel's own sequential read-ahead follows the reads.

IMPORTANT: a hint changes nothing and its failure is never the restore's: the reads that follow
check every range and every checksum as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import operator
from collections.abc import Iterable

import numpy as np

from snapshotkit._plan.reads import MAX_GAP_BYTES
from snapshotkit._restore.columns import ColumnView
from snapshotkit.storage import ByteRange, StoragePlugin

logger = logging.getLogger("snapshotkit.restore")


@dataclasses.dataclass(frozen=True)
class PrefetchRange:
    """``byte_range`` of the data object ``location`` (of this snapshot) that a restore will read."""

    location: str
    byte_range: ByteRange


def prefetch_ranges(view: ColumnView, roots: Iterable[str] | None, budget_bytes: int) -> list[PrefetchRange]:
    """The ranges holding the pieces of the tensors of ``view`` at or below ``roots`` (escaped
    app_state keys; None: every tensor of ``view``) that live in this snapshot, pieces no more
    than :data:`MAX_GAP_BYTES` apart merged, in (data object, offset) order, cut to the first
    ``budget_bytes``."""
    c = view.columns
    if roots is None:
        slots = view.slots.values()  # the tensors' column indices (containers and rows are entries)
        indices = list(itertools.compress(slots, map(operator.is_, map(type, slots), itertools.repeat(int))))
    else:
        prefixes = tuple(f"{root}/" for root in roots)
        tops = set(roots)
        paths = list(view.slots)
        within = map(str.startswith, paths, itertools.repeat(prefixes))
        indices = [
            slot
            for path, slot, inside in zip(paths, view.slots.values(), within, strict=True)
            if type(slot) is int and (inside or path in tops)
        ]
    if not indices or budget_bytes <= 0:
        return []
    entry = np.array(indices, dtype=np.int64)
    first, count = c.piece_offsets[entry], c.piece_offsets[entry + 1] - c.piece_offsets[entry]
    pieces = np.arange(int(count.sum()), dtype=np.int64) + np.repeat(first - (np.cumsum(count) - count), count)
    pieces = pieces[(c.base[pieces] == 0) & (c.length[pieces] > 0)]  # a base's pieces live in another snapshot
    if not len(pieces):
        return []
    order = np.lexsort((c.start[pieces], c.location[pieces]))
    location, start = c.location[pieces][order], c.start[pieces][order]
    end = start + c.length[pieces][order]
    # overlapping pieces: a span ends at the furthest end so far within its data object
    # (each object's ends lifted above the previous object's, so the running maximum restarts)
    lift = location.astype(np.int64) * (int(end.max()) + 1)
    reach = np.maximum.accumulate(end + lift) - lift
    cut = np.ones(len(order), dtype=bool)
    cut[1:] = (location[1:] != location[:-1]) | (start[1:] > reach[:-1] + MAX_GAP_BYTES)
    firsts = np.flatnonzero(cut)
    lasts = np.append(firsts[1:], len(order)) - 1
    spans: list[PrefetchRange] = []
    left = budget_bytes
    for low, high in zip(firsts.tolist(), lasts.tolist(), strict=True):
        span_start = int(start[low])
        span_end = min(int(reach[high]), span_start + left)
        spans.append(PrefetchRange(c.locations[int(location[low])], ByteRange(span_start, span_end)))
        left -= span_end - span_start
        if left <= 0:
            break
    return spans


async def prefetch(plugin: StoragePlugin, ranges: list[PrefetchRange]) -> None:
    """Hand ``ranges`` to ``plugin``'s :meth:`~snapshotkit.storage.StoragePlugin.prefetch`; a
    failure is logged and dropped (the reads that follow report what is wrong)."""
    try:
        await asyncio.gather(*(plugin.prefetch(r.location, r.byte_range) for r in ranges))
    except Exception as exc:
        logger.debug("read-ahead hint failed, the reads will say why: %r", exc)
