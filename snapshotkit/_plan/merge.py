"""From what each rank wrote to the snapshot's manifest (pure: no I/O, no process group).

Each rank turns its :class:`~snapshotkit._plan.rank_plan.TakePlan` and the final pieces of
its slots (written, or referenced in a base) into a :class:`RankResult`; rank 0 merges every
rank's result into the manifest, assembling replicated and sharded entries from the pieces all ranks wrote.
"""

from __future__ import annotations

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
from snapshotkit._plan.decide import Decision, PieceKey
from snapshotkit._plan.layout import PieceSlot
from snapshotkit._plan.leaves import TensorLeaf
from snapshotkit._plan.rank_plan import PendingObject, PendingReplicated, PendingSharded, PendingTensor, TakePlan
from snapshotkit.errors import UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What a rank wrote: its finished entries (rank 0's also hold the pending shared ones) and
    the pieces of replicated and sharded leaves it wrote."""

    entries: Mapping[str, Entry | PendingReplicated | PendingSharded]
    shared: Mapping[PieceKey, Piece]


def finish_rank(plan: TakePlan, written: Mapping[PieceSlot, Piece]) -> RankResult:
    """This rank's :class:`RankResult`, given the final piece of every slot it wrote."""

    def pieces(payload: int) -> tuple[Piece, ...]:
        return tuple(written[slot] for slot in plan.slots.get(payload, ()))

    entries: dict[str, Entry | PendingReplicated | PendingSharded] = {}
    for key, entry in plan.entries.items():
        if isinstance(entry, PendingTensor):
            entries[key] = TensorEntry(entry.dtype, entry.shape, entry.serializer, pieces(entry.payload), False)
        elif isinstance(entry, PendingObject):
            (piece,) = pieces(entry.payload)  # serialized bytes are never empty: exactly one piece
            entries[key] = ObjectEntry(entry.obj_type, piece, False)
        else:
            entries[key] = entry
    shared = {key: written[slot] for key, slot in plan.shared_slots.items()}
    return RankResult(entries, shared)


def merge_results(results: Sequence[RankResult], decision: Decision, layouts: Mapping[str, str]) -> dict[str, Entry]:
    """The snapshot's manifest: every rank's entries, shared leaves assembled from all ranks' pieces.

    ``layouts`` maps each sharded tensor's path to its informative layout text.
    """
    shared: dict[PieceKey, Piece] = {}
    for result in results:
        shared.update(result.shared)

    def collect(path: str, shard_offsets: tuple[int, ...] | None = None) -> tuple[Piece, ...]:
        return tuple(shared[key] for key in decision.pieces(path, shard_offsets))

    manifest: dict[str, Entry] = {}
    for result in results:
        for key, entry in result.entries.items():
            if isinstance(entry, PendingReplicated):
                template = entry.template
                pieces = collect(entry.source)
                if isinstance(template, TensorLeaf):
                    manifest[key] = TensorEntry(template.dtype, template.shape, template.serializer, pieces, True)
                else:
                    (piece,) = pieces
                    manifest[key] = ObjectEntry(template.obj_type, piece, True)
            elif isinstance(entry, PendingSharded):
                description = decision.sharded[entry.path]
                shards = tuple(
                    Shard(box.offsets, box.sizes, collect(entry.path, box.offsets)) for box in description.boxes
                )
                manifest[key] = ShardedTensorEntry(
                    description.dtype, description.shape, shards, layouts.get(entry.path, "")
                )
            else:
                manifest[key] = entry
    return manifest


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
