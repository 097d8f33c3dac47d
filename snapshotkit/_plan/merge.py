"""From what each rank wrote to the snapshot's manifest (pure: no I/O, no process group).

Each rank turns its :class:`~snapshotkit._plan.rank_plan.TakePlan` and the final pieces of
its slots (written, or referenced in a base) into a :class:`RankResult`; rank 0 merges every
rank's result into the manifest, assembling replicated and sharded entries from the pieces all ranks wrote.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence

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
    without them goes into the manifest as it is.
    """

    entries: Mapping[str, Entry | PendingReplicated | PendingSharded]
    shared: Mapping[PieceKey, Piece]
    pending: bool = dataclasses.field(default=True, compare=False)


def finish_rank(plan: TakePlan, written: Mapping[PieceSlot, Piece]) -> RankResult:
    """This rank's :class:`RankResult`, given the final piece of every slot it wrote."""

    def pieces(payload: int) -> tuple[Piece, ...]:
        return tuple(written[slot] for slot in plan.slots.get(payload, ()))

    entries: dict[str, Entry | PendingReplicated | PendingSharded] = {}
    pending = False
    for key, entry in plan.entries.items():
        if isinstance(entry, PendingTensor):
            entries[key] = TensorEntry(entry.dtype, entry.shape, entry.serializer, pieces(entry.payload), False)
        elif isinstance(entry, PendingObject):
            (piece,) = pieces(entry.payload)  # serialized bytes are never empty: exactly one piece
            entries[key] = ObjectEntry(entry.obj_type, piece, False)
        else:
            entries[key] = entry
            pending = pending or isinstance(entry, (PendingReplicated, PendingSharded))
    shared = {key: written[slot] for key, slot in plan.shared_slots.items()}
    return RankResult(entries, shared, pending)


def merge_results(results: Sequence[RankResult], decision: Decision, layouts: Mapping[str, str]) -> dict[str, Entry]:
    """The snapshot's manifest: every rank's entries, shared leaves assembled from all ranks' pieces.

    ``layouts`` maps each sharded tensor's path to its informative layout text. The work is one
    pass over the pieces the ranks wrote (each sharded piece put straight into its box's place)
    and one over the distinct boxes of each sharded tensor; a rank's entries without pending
    ones are copied as they are.
    """
    replicated: dict[PieceKey, Piece] = {}
    sharded = {path: _Placed.of(planned) for path, planned in decision.sharded_pieces.items()}
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
