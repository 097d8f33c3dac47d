"""From what each rank wrote to the snapshot's manifest (pure: no I/O, no process group).

Each rank turns its :class:`~snapshotkit._plan.rank_plan.TakePlan` and the final pieces of
its slots (written, or referenced in a base) into a :class:`RankResult`; rank 0 merges every
rank's result into the manifest, assembling replicated and sharded entries from the pieces all ranks wrote.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
from collections.abc import Mapping, Sequence

import numpy as np

from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    Shard,
    ShardedTensorEntry,
    TensorEntry,
)
from snapshotkit._plan.decide import Decision, PieceKey, ShardedPieces
from snapshotkit._plan.layout import PieceSlot
from snapshotkit._plan.leaves import TensorLeaf
from snapshotkit._plan.rank_plan import PendingObject, PendingReplicated, PendingSharded, PendingTensor, TakePlan
from snapshotkit.errors import UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What a rank wrote: its finished entries (rank 0's also hold the pending shared ones) and
    the pieces of replicated and sharded leaves it wrote.

    ``pending``: whether ``entries`` holds pending shared entries (only rank 0's do); a result
    without them goes into the manifest as it is. ``ordered``: ``shared`` holds the rank's
    replicated pieces first, then its sharded ones in the decision's order (as
    :attr:`~snapshotkit._plan.rank_plan.TakePlan.shared_slots` lists them), so the merge places
    them by position instead of by key; ``rank`` names the rank (-1: unknown).
    """

    entries: Mapping[str, Entry | PendingReplicated | PendingSharded]
    shared: Mapping[PieceKey, Piece]
    pending: bool = dataclasses.field(default=True, compare=False)
    ordered: bool = dataclasses.field(default=False, compare=False)
    rank: int = dataclasses.field(default=-1, compare=False)


def finish_rank(plan: TakePlan, written: Mapping[PieceSlot, Piece]) -> RankResult:
    """This rank's :class:`RankResult`, given the final piece of every slot it wrote."""

    slots = plan.slots

    def pieces(payload: int) -> tuple[Piece, ...]:
        held = slots.get(payload, ())
        return (written[held[0]],) if len(held) == 1 else tuple([written[slot] for slot in held])

    entries: dict[str, Entry | PendingReplicated | PendingSharded] = {}
    pending = False
    for key, entry in plan.entries.items():
        if type(entry) is PendingTensor:  # the common case first: one entry per tensor
            held = slots.get(entry.payload, ())
            found = (written[held[0]],) if len(held) == 1 else tuple([written[slot] for slot in held])
            entries[key] = TensorEntry(entry.dtype, entry.shape, entry.serializer, found, False)
        elif isinstance(entry, PendingTensor):
            entries[key] = TensorEntry(entry.dtype, entry.shape, entry.serializer, pieces(entry.payload), False)
        elif isinstance(entry, PendingObject):
            (piece,) = pieces(entry.payload)  # serialized bytes are never empty: exactly one piece
            entries[key] = ObjectEntry(entry.obj_type, piece, False)
        else:
            entries[key] = entry
            pending = pending or isinstance(entry, (PendingReplicated, PendingSharded))
    shared = {key: written[slot] for key, slot in plan.shared_slots.items()}
    return RankResult(entries, shared, pending, ordered=True, rank=plan.rank)


def merge_results(results: Sequence[RankResult], decision: Decision, layouts: Mapping[str, str]) -> dict[str, Entry]:
    """The snapshot's manifest: every rank's entries, shared leaves assembled from all ranks' pieces.

    ``layouts`` maps each sharded tensor's path to its informative layout text. The ranks' sharded
    pieces are placed by position (one permutation of them all, from the decision's owners) when
    every result is :attr:`~RankResult.ordered`, else by key; then each sharded tensor's distinct
    boxes are made once. A rank's entries without pending ones are copied as they are.
    """
    replicated: dict[PieceKey, Piece] = {}
    sharded = {path: _Placed.of(planned) for path, planned in decision.sharded_pieces.items()}
    if not _place_in_order(results, decision, replicated, sharded):
        _place_by_key(results, replicated, sharded)

    manifest: dict[str, Entry] = {}
    for result in results:
        if not result.pending:
            manifest.update(result.entries)  # type: ignore[arg-type]  # no pending entry: finished ones only
            continue
        for key, entry in result.entries.items():
            if isinstance(entry, PendingReplicated):
                template = entry.template
                pieces = tuple(replicated[piece_key] for piece_key in decision.pieces(entry.source))
                if isinstance(template, TensorLeaf):
                    manifest[key] = TensorEntry(template.dtype, template.shape, template.serializer, pieces, True)
                else:
                    (piece,) = pieces
                    manifest[key] = ObjectEntry(template.obj_type, piece, True)
            elif isinstance(entry, PendingSharded):
                manifest[key] = sharded[entry.path].entry(layouts.get(entry.path, ""))
            else:
                manifest[key] = entry
    return manifest


def _place_in_order(
    results: Sequence[RankResult],
    decision: Decision,
    replicated: dict[PieceKey, Piece],
    sharded: Mapping[str, _Placed],
) -> bool:
    """Place every rank's pieces by position: its replicated pieces first, then its sharded ones,
    which are, in the decision's order, the pieces the decision gave it. False (nothing placed)
    unless every result is :attr:`~RankResult.ordered` and holds exactly the pieces it was given."""
    owners = [planned.owner for planned in decision.sharded_pieces.values()]
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    results = sorted(results, key=lambda result: result.rank)  # the results may come in any order
    if not all(result.ordered and result.rank == rank for rank, result in enumerate(results)):
        return False
    if len(owner) and int(owner.max()) >= len(results):
        return False
    sharded_counts = np.bincount(owner, minlength=len(results)).tolist()
    replicated_counts = [0] * len(results)
    for rank in decision.replicated_owner.values():
        if rank < len(results):
            replicated_counts[rank] += 1
    if any(len(result.shared) != replicated_counts[rank] + sharded_counts[rank] for rank, result in enumerate(results)):
        return False
    reported: list[Piece] = []
    for rank, result in enumerate(results):
        if replicated_counts[rank]:
            replicated.update(itertools.islice(result.shared.items(), replicated_counts[rank]))
        reported.extend(itertools.islice(result.shared.values(), replicated_counts[rank], None))
    # The decision's sharded pieces grouped by writer (ranks ascending, each in the decision's
    # order) are exactly the ranks' reports one after the other: piece i of the decision is
    # reported[where[i]].
    where = np.empty(len(owner), dtype=np.int64)
    where[np.argsort(owner, kind="stable")] = np.arange(len(owner))
    at = 0
    for target in sharded.values():
        count = len(target.pieces)
        if count == 1:
            target.pieces[0] = reported[int(where[at])]
        elif count:
            target.pieces[:] = operator.itemgetter(*where[at : at + count].tolist())(reported)
        at += count
    return True


def _place_by_key(
    results: Sequence[RankResult], replicated: dict[PieceKey, Piece], sharded: Mapping[str, _Placed]
) -> None:
    """Place every rank's pieces by their keys (results in any order)."""
    # path -> (pieces, first, index) of its _Placed: tuples unpack faster than attributes are read
    slots = {path: (placed.pieces, placed.first, placed.index) for path, placed in sharded.items()}
    reported = 0
    for result in results:
        reported += len(result.shared)
        for shared_key, piece in result.shared.items():
            if (offsets := shared_key.shard_offsets) is None:
                replicated[shared_key] = piece
                reported -= 1
            else:
                placed_pieces, first, index = slots[shared_key.path]
                placed_pieces[first[index[offsets]] + shared_key.index] = piece
    if reported != sum(len(placed.pieces) for placed in sharded.values()):
        _missing(sharded)


def _missing(sharded: Mapping[str, _Placed]) -> None:
    """Raise for the first piece no rank reported (a bug: the decision gave it to a rank that did not)."""
    for path, placed in sharded.items():
        for at, piece in enumerate(placed.pieces):
            if piece is None:
                box = bisect.bisect_right(placed.first, at) - 1
                raise KeyError(f"no rank reported a piece of the box at {placed.offsets[box]} of {path!r}")
    raise KeyError("the ranks reported a sharded piece twice")


@dataclasses.dataclass(frozen=True)
class _Placed:
    """A sharded tensor's pieces as the ranks' results fill them in: box ``b``'s pieces go to
    ``pieces[first[b]:first[b + 1]]`` (plain lists: this runs once per piece of the snapshot)."""

    dtype: str
    shape: tuple[int, ...]
    index: Mapping[tuple[int, ...], int]
    offsets: list[tuple[int, ...]]
    sizes: list[tuple[int, ...]]
    first: list[int]
    pieces: list[Piece | None]

    @classmethod
    def of(cls, planned: ShardedPieces) -> _Placed:
        table = planned.table
        first = planned.pieces.first.tolist()
        return cls(
            table.dtype, table.shape, table.index, table.offset_tuples, table.size_tuples, first, [None] * first[-1]
        )

    def entry(self, layout: str) -> ShardedTensorEntry:
        """The entry, each distinct box in order with its pieces."""
        pieces, first = self.pieces, self.first
        shards = [
            Shard(offsets, sizes, (pieces[low],) if high - low == 1 else tuple(pieces[low:high]))  # type: ignore[arg-type]
            for offsets, sizes, low, high in zip(self.offsets, self.sizes, first, first[1:], strict=False)
        ]
        return ShardedTensorEntry(self.dtype, self.shape, tuple(shards), layout)


def merge_parts(parts: Sequence[Mapping[str, Entry]]) -> dict[str, Entry]:
    """One manifest from the manifests of takes that each wrote part of one state (DCP's ranks,
    each a take of its own write items): dicts hold the union of their keys, a sharded tensor
    the shards of every part, anything else comes from the one part that holds it, marked
    replicated: the state is global (a DCP key names one value for every rank), so every rank's
    view of the snapshot holds it.

    Raises:
        UnsupportedValueError: parts disagree on a path (a sharded tensor's global dtype or shape,
            a leaf held by two parts, a dict in one and a leaf in another), or a sharded tensor's
            shards do not cover it exactly once.
    """
    merged: dict[str, Entry] = {}
    for part in parts:
        for key, entry in part.items():
            seen = merged.get(key)
            if seen is None:
                merged[key] = entry
                if isinstance(entry, (TensorEntry, ObjectEntry, PrimitiveEntry)):
                    merged[key] = dataclasses.replace(entry, replicated=True)
            elif isinstance(seen, DictEntry) and isinstance(entry, DictEntry):
                known = set(seen.keys)
                merged[key] = DictEntry(seen.keys + tuple(k for k in entry.keys if k not in known), seen.ordered)
            elif (
                isinstance(seen, ShardedTensorEntry)
                and isinstance(entry, ShardedTensorEntry)
                and (seen.dtype, seen.shape) == (entry.dtype, entry.shape)
            ):
                held = {(shard.offsets, shard.sizes) for shard in seen.shards}
                extra = tuple(shard for shard in entry.shards if (shard.offsets, shard.sizes) not in held)
                merged[key] = dataclasses.replace(seen, shards=seen.shards + extra)
            else:
                raise UnsupportedValueError(
                    f"two ranks wrote {key.partition('/')[2]!r} differently (a {seen.kind} and a {entry.kind}); "
                    "every DCP write item must be written by one rank (DCP's planner deduplicates them)"
                )
    for key, entry in merged.items():
        if isinstance(entry, ShardedTensorEntry):
            covered = sum(math.prod(shard.sizes) for shard in entry.shards)
            if covered != math.prod(entry.shape):
                raise UnsupportedValueError(
                    f"the chunks of {key.partition('/')[2]!r} written by the ranks cover {covered} of its "
                    f"{math.prod(entry.shape)} elements (overlapping or missing chunks); every element of a "
                    "sharded tensor must be in exactly one rank's write items"
                )
    return merged
