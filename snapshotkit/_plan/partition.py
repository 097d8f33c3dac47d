"""Pure multi-rank planning: which rank writes each replicated or sharded piece.

Every rank runs these functions on the same exchanged inputs and gets the same answer, so no
rank has to decide for the others and nothing more is sent. Nothing here does I/O or talks to
a process group.

Balancing is greedy "largest first onto the least loaded rank" (LPT), starting from each rank's
own rank-local bytes, over pieces rather than whole tensors: a replicated tensor larger than a
piece is spread over several ranks. A piece of a sharded tensor may only be written by a rank
that holds it (``holders``); among those the least loaded wins.
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
    """The writing rank of every item, balancing bytes over ranks (deterministic).

    ``base_loads[r]`` is what rank ``r`` writes anyway (its rank-local bytes). Ties go to the
    lower rank. Cost: O(n log n) for sorting plus O(log R) per unrestricted item.
    """
    loads = list(base_loads)
    heap = [(load, rank) for rank, load in enumerate(loads)]
    heapq.heapify(heap)
    owner: dict[K, int] = {}
    ordered = sorted(items, key=lambda item: (-item.nbytes, repr(item.key)))
    for item in ordered:
        if item.holders is None:
            while True:
                load, rank = heapq.heappop(heap)
                if load == loads[rank]:
                    break  # else a stale entry left behind by a restricted assignment
        else:
            rank = min(item.holders, key=lambda r: (loads[r], r))
        owner[item.key] = rank
        loads[rank] += item.nbytes
        heapq.heappush(heap, (loads[rank], rank))
    return owner


def common_patterns(per_rank: Sequence[Iterable[str]]) -> list[str]:
    """Glob patterns every rank passed (torchsnapshot's rule: a pattern counts only if all pass it)."""
    sets = [set(patterns) for patterns in per_rank]
    return sorted(set.intersection(*sets)) if sets else []


def matches_any(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def replicated_paths(
    candidates_per_rank: Sequence[Mapping[str, Hashable]], patterns: Sequence[str]
) -> tuple[set[str], dict[str, list[int]]]:
    """Paths that are replicated: matched by a common pattern and present, alike, on every rank.

    ``candidates_per_rank[r]`` maps each leaf path rank ``r`` offered as replicated to a
    signature (kind, dtype, shape, size). Returns the replicated set and, for paths present on
    every rank but with differing signatures, the ranks that disagree with rank 0 (those paths
    are stored per rank instead).
    """
    if not candidates_per_rank:
        return set(), {}
    first = candidates_per_rank[0]
    chosen: set[str] = set()
    differing: dict[str, list[int]] = {}
    for path, signature in first.items():
        if not matches_any(path, patterns):
            continue
        if not all(path in other for other in candidates_per_rank[1:]):
            continue
        disagree = [r for r, other in enumerate(candidates_per_rank) if other[path] != signature]
        if disagree:
            differing[path] = disagree
        else:
            chosen.add(path)
    return chosen, differing
