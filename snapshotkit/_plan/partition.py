"""Pure multi-rank planning: which rank writes each replicated or sharded piece.

Every rank runs these functions on the same exchanged inputs and gets the same answer, so no
rank has to decide for the others and nothing more is sent. Nothing here does I/O or talks to
a process group.

Balancing is greedy "largest first onto the least loaded rank" (LPT), starting from each rank's
own rank-local bytes, over pieces rather than whole tensors: a replicated tensor larger than a
piece is spread over several ranks. A piece of a sharded tensor may only be written by a rank
that holds it (``holders``); among those the least loaded wins.

What the balancing guarantees (:func:`assign_writers`), for items any rank may write:

* spread: afterwards, the most loaded rank carries at most
  ``max(max(base_loads) - min(base_loads), largest item)`` more than the least loaded one
  (each item goes onto the least loaded rank, so a rank that becomes the most loaded is at most
  one item above every other); with equal base loads, at most the largest item;
* makespan: with equal base loads, the most loaded rank carries at most
  ``(4/3 - 1/(3R))`` times the least possible maximum over all assignments to ``R`` ranks
  (Graham's bound for largest-processing-time-first list scheduling), plus the base load.

Restricted items (``holders``) are placed least-loaded-holder-first in the same order, and carry
no such bound: the ranks allowed to write them may all be busy.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass(frozen=True)
class WriteItem(Generic[K]):
    """A piece some rank must write: ``key`` names it identically on every rank."""

    key: K
    nbytes: int
    holders: tuple[int, ...] | None = None  # ranks allowed to write it; None: any rank


def assign_writers(items: Iterable[WriteItem[K]], base_loads: Sequence[int]) -> dict[K, int]:
    """The writing rank of every item, balancing bytes over ranks (see the module docstring).

    ``base_loads[r]`` is what rank ``r`` writes anyway (its rank-local bytes). Items are placed
    largest first (equal sizes in order of ``repr(key)``), each onto the least loaded rank
    allowed to write it; ties go to the lower rank. Keys, and their reprs, must be distinct;
    then the answer depends only on the set of items, not on their order. Cost: O(n log n) for
    sorting plus O(log R) per item, amortized (a restricted item makes at most one heap entry
    stale, refreshed by a later pop), and O(holders) per restricted one.
    """
    loads = list(base_loads)
    # IMPORTANT: the heap holds exactly one entry per rank, never above that rank's load. A
    # restricted item raises a load without touching the heap; a popped entry below its rank's
    # load is refreshed and the pop retried, so the entry taken is the least (load, rank) pair.
    heap = [(load, rank) for rank, load in enumerate(loads)]
    heapq.heapify(heap)
    owner: dict[K, int] = {}
    ordered = sorted(items, key=lambda item: (-item.nbytes, repr(item.key)))
    for item in ordered:
        holders = item.holders
        if holders is None:
            while (entry := heap[0])[0] != loads[rank := entry[1]]:
                heapq.heapreplace(heap, (loads[rank], rank))
            loads[rank] += item.nbytes
            heapq.heapreplace(heap, (loads[rank], rank))
        else:
            if len(holders) == 1:
                (rank,) = holders
            else:  # the least (load, rank) pair: ties go to the lower rank whatever the holders' order
                rank = min(zip(map(loads.__getitem__, holders), holders, strict=True))[1]
            loads[rank] += item.nbytes
        owner[item.key] = rank
    return owner


def common_patterns(per_rank: Sequence[Iterable[str]]) -> list[str]:
    """Glob patterns every rank passed (torchsnapshot's rule: a pattern counts only if all pass it)."""
    sets = [set(patterns) for patterns in per_rank]
    return sorted(set.intersection(*sets)) if sets else []


def matches_any(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


@dataclasses.dataclass(frozen=True)
class ReplicatedPaths:
    """Which offered paths are stored once for all ranks.

    Attributes:
        chosen: paths matched by a common pattern and present, alike, on every rank.
        differing: paths matched by a common pattern and present on every rank, but with
            differing signatures -> the ranks that disagree with rank 0, ascending (those paths
            are stored per rank instead).
    """

    chosen: frozenset[str]
    differing: Mapping[str, tuple[int, ...]]


def replicated_paths(candidates_per_rank: Sequence[Mapping[str, Hashable]], patterns: Sequence[str]) -> ReplicatedPaths:
    """Paths that are replicated: matched by a common pattern and present, alike, on every rank.

    ``candidates_per_rank[r]`` maps each leaf path rank ``r`` offered as replicated to a
    signature (kind, dtype, shape, size). A path missing on some rank is neither chosen nor
    differing.
    """
    if not candidates_per_rank:
        return ReplicatedPaths(frozenset(), {})
    first = candidates_per_rank[0]
    chosen: set[str] = set()
    differing: dict[str, tuple[int, ...]] = {}
    for path, signature in first.items():
        if not matches_any(path, patterns):
            continue
        if not all(path in other for other in candidates_per_rank[1:]):
            continue
        disagree = tuple(r for r, other in enumerate(candidates_per_rank) if other[path] != signature)
        if disagree:
            differing[path] = disagree
        else:
            chosen.add(path)
    return ReplicatedPaths(frozenset(chosen), differing)
