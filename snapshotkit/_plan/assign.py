""":func:`~snapshotkit._plan.partition.assign_writers`, vectorized: the same owners, per size.

LPT places items largest first (equal sizes in the order of their keys' ``repr``), each onto
the least loaded rank allowed to write it. An item only one rank holds goes to that rank
whatever the order, so when every item of one size is such an item (a fully sharded tensor's
boxes, one per rank), the whole size is placed at once: one ``bincount``. Only sizes that mix
them with items several ranks may write are placed item by item, in ``repr`` order, exactly as
:func:`~snapshotkit._plan.partition.assign_writers` does; the least loaded rank is an ``argmin``
over the loads (of every rank, or of the item's holders). Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

#: ``holder`` of an item any rank may write.
ANY_RANK = -1
#: ``holder`` of an item several ranks (``holders_of``) may write.
SOME_RANKS = -2


@dataclasses.dataclass(frozen=True)
class Items:
    """Items to place, as arrays.

    Attributes:
        nbytes: int64 per item.
        holder: per item, the one rank that may write it, :data:`ANY_RANK` or :data:`SOME_RANKS`.
        holders_of: item index -> the ranks (ascending, int64) that may write a :data:`SOME_RANKS` item.
        key_text: item index -> ``repr`` of its key (orders equal sizes; asked only for sizes
            that are placed item by item).
    """

    nbytes: Array
    holder: Array
    holders_of: Callable[[int], Array]
    key_text: Callable[[int], str]


def assign(items: Items, base_loads: Sequence[int] | Array) -> Array:
    """The writing rank of every item (int64 per item), as
    :func:`~snapshotkit._plan.partition.assign_writers` with the same base loads would place them."""
    loads = np.asarray(base_loads, dtype=np.int64).copy()
    owner = np.empty(len(items.nbytes), dtype=np.int64)
    if not len(owner):
        return owner
    order = np.argsort(-items.nbytes, kind="stable")
    sizes = items.nbytes[order]
    bounds = np.flatnonzero(np.diff(sizes)) + 1
    for group in np.split(order, bounds):
        size = int(items.nbytes[group[0]])
        holder = items.holder[group]
        if (holder >= 0).all():
            loads += np.bincount(holder, minlength=len(loads)) * size
            owner[group] = holder
            continue
        for item in sorted(group.tolist(), key=items.key_text):
            rank = int(items.holder[item])
            if rank == ANY_RANK:
                rank = int(np.argmin(loads))  # ties: the lowest rank, as the heap of assign_writers
            elif rank == SOME_RANKS:
                allowed = items.holders_of(item)
                rank = int(allowed[np.argmin(loads[allowed])])
            loads[rank] += size
            owner[item] = rank
    return owner
