"""One rank's take plan: its manifest entries-to-be and the data objects it writes.

Given the shared :class:`~snapshotkit._plan.decide.Decision`, a rank writes its rank-local
payloads and the replicated/sharded pieces the decision gave it, packed into data objects by
:func:`~snapshotkit._plan.layout.pack_pieces`. Entries whose pieces are not known until the
writes finished (checksums) or that other ranks help write are *pending* until
:mod:`snapshotkit._plan.merge` turns them into manifest entries.

A plan is built in two steps, so that a later take of the same structure can reuse the first
(:mod:`snapshotkit._take.plan_cache`): :func:`fix_plan` lays out what the structure alone fixes
(every entry, the pieces of raw tensors and of replicated and sharded leaves), and
:func:`finish_plan` adds what each take brings: primitive values, the serialized bytes of
rank-local objects (their sizes change from take to take; they go in data objects of their own,
after the others), and the data objects' names (the take's id).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from snapshotkit._format.entries import Entry, PrimitiveEntry
from snapshotkit._format.serialization import RAW
from snapshotkit._plan.decide import Decision, PieceKey
from snapshotkit._plan.layout import (
    DataObjectPlan,
    PayloadSpan,
    PieceSlot,
    data_object_location,
    pack_columns,
    pack_pieces,
    split_payload,
)
from snapshotkit._plan.leaves import LocalState, ObjectLeaf, ShardedLeaf, TensorLeaf


@dataclasses.dataclass(frozen=True, slots=True)
class PendingTensor:
    """A rank-local tensor; its pieces are this rank's slots of ``payload``."""

    payload: int
    dtype: str
    shape: tuple[int, ...]
    serializer: str


@dataclasses.dataclass(frozen=True, slots=True)
class PendingObject:
    """A rank-local object; its one piece is this rank's slot of ``payload``."""

    payload: int
    obj_type: str


@dataclasses.dataclass(frozen=True, slots=True)
class PendingReplicated:
    """A replicated leaf (in rank 0's entries only) whose pieces several ranks may write.

    ``source`` is the path whose pieces it uses: itself, or the tensor it is tied to.
    """

    source: str
    template: TensorLeaf | ObjectLeaf


@dataclasses.dataclass(frozen=True, slots=True)
class PendingSharded:
    """A sharded tensor (in rank 0's entries only), assembled from every rank's box pieces."""

    path: str


PendingEntry = Entry | PendingTensor | PendingObject | PendingReplicated | PendingSharded


@dataclasses.dataclass(frozen=True)
class TakePlan:
    """Everything this rank writes, decided before the first byte moves.

    Attributes:
        rank: the rank it is for.
        entries: manifest key (``"<rank>/<logical path>"``) -> entry or pending entry.
        data_objects: the data objects to write, in order (a slot's ``object_index`` indexes them).
        slots: rank-local payload index -> the slots holding its pieces, in order.
        shared_slots: replicated/sharded piece -> its slot, for the pieces this rank writes:
            replicated pieces first, then sharded ones in the decision's order.
    """

    rank: int
    entries: Mapping[str, PendingEntry]
    data_objects: tuple[DataObjectPlan, ...]
    slots: Mapping[int, tuple[PieceSlot, ...]]
    shared_slots: Mapping[PieceKey, PieceSlot]

    @property
    def nbytes(self) -> int:
        return sum(plan.nbytes for plan in self.data_objects)


@dataclasses.dataclass(frozen=True)
class FixedPlan:
    """The part of a rank's plan that the structure alone decides (see the module docstring).

    Attributes:
        rank: the rank it is for.
        entries: every entry in order; a primitive's holds the value of the take that planned
            until :func:`finish_plan` puts the take's own.
        primitives: manifest key -> logical path of every rank-local primitive.
        replicated_primitives: the same for replicated primitives (rank 0 only).
        data_objects: the data objects of raw tensors' and shared pieces, unnamed (their
            locations end in an empty take id).
        slots: rank-local payload index -> its slots, for payloads of raw tensors.
        shared_slots: replicated/sharded piece -> its slot, for the pieces this rank writes.
        serialized: rank-local payloads of serialized bytes (objects, tensors stored through
            ``torch.save``), ascending: laid out by each take.
    """

    rank: int
    entries: Mapping[str, PendingEntry]
    primitives: Mapping[str, str]
    replicated_primitives: Mapping[str, str]
    data_objects: tuple[DataObjectPlan, ...]
    slots: Mapping[int, tuple[PieceSlot, ...]]
    shared_slots: Mapping[PieceKey, PieceSlot]
    serialized: tuple[int, ...]


def plan_rank(
    local: LocalState,
    decision: Decision,
    *,
    rank: int,
    take_id: str,
    chunk_bytes: int,
    data_object_bytes: int,
) -> TakePlan:
    """This rank's entries and data objects under ``decision``.

    Replicated and sharded leaves appear only in rank 0's entries (every rank reads them from
    there); each rank writes the pieces of them the decision gave it.
    """
    fixed = fix_plan(local, decision, rank=rank, chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes)
    return finish_plan(fixed, local, take_id=take_id, chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes)


def fix_plan(
    local: LocalState,
    decision: Decision,
    *,
    rank: int,
    chunk_bytes: int,
    data_object_bytes: int,
) -> FixedPlan:
    """The structural part of :func:`plan_rank`'s plan: valid for every take of a state whose
    description differs from ``local`` only in primitive values and serialized bytes (of
    rank-local leaves: a replicated leaf's size is part of ``decision``)."""
    entries: dict[str, PendingEntry] = {f"{rank}/{path}": c for path, c in local.containers.items()}
    primitives: dict[str, str] = {}
    replicated_primitives: dict[str, str] = {}
    shared: list[PayloadSpan] = []
    shared_keys: list[PieceKey] = []
    local_payloads: set[int] = set()
    serialized: set[int] = set()

    def take_mine(path: str, payload: int, shard_offsets: tuple[int, ...] | None = None) -> None:
        for key, span, owner in decision.shares(path, shard_offsets):
            if owner == rank:
                shared.append(PayloadSpan.of(payload, span))
                shared_keys.append(key)

    replicated = decision.replicated
    for path, leaf in local.leaves.items():
        key = f"{rank}/{path}"
        if type(leaf) is TensorLeaf and path not in replicated:  # the common case first
            entries[key] = PendingTensor(leaf.payload, leaf.dtype, leaf.shape, leaf.serializer)
            (serialized if leaf.serializer != RAW else local_payloads).add(leaf.payload)
        elif isinstance(leaf, ShardedLeaf):
            for shard in leaf.boxes:
                take_mine(path, shard.payload, shard.box.offsets)
            if rank == 0:
                entries[key] = PendingSharded(path)
        elif path in replicated:
            if isinstance(leaf, PrimitiveEntry):
                if rank == 0:
                    entries[key] = PrimitiveEntry.of(leaf.value, True)
                    replicated_primitives[key] = path
                continue
            assert isinstance(leaf, (TensorLeaf, ObjectLeaf))
            alias = leaf.alias_of if isinstance(leaf, TensorLeaf) else None
            if alias is None:
                take_mine(path, leaf.payload)
            if rank == 0:
                entries[key] = PendingReplicated(alias or path, leaf)
        elif isinstance(leaf, PrimitiveEntry):
            entries[key] = leaf
            primitives[key] = path
        elif isinstance(leaf, TensorLeaf):
            entries[key] = PendingTensor(leaf.payload, leaf.dtype, leaf.shape, leaf.serializer)
            (serialized if leaf.serializer != RAW else local_payloads).add(leaf.payload)
        else:
            assert isinstance(leaf, ObjectLeaf)
            entries[key] = PendingObject(leaf.payload, leaf.obj_type)
            serialized.add(leaf.payload)
    # The pieces as three columns (payload, start, end): rank-local ones by payload, then the
    # shared ones. IMPORTANT: the shared pieces in the decision's order (replicated ones, then
    # sharded ones by Decision.sharded_position): merge_results places a rank's sharded pieces by
    # that order alone.
    owned = sorted(local_payloads)
    piece_payloads: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    payloads = local.payloads
    split: list[tuple[int, int, int]] = []  # (payload, first piece, last piece + 1) of payloads cut in several
    for index in owned:
        payload = payloads[index]
        nbytes = payload.nbytes
        if nbytes <= chunk_bytes:  # one piece (none if empty): what split_payload gives, without its Span
            if nbytes:
                piece_payloads.append(index)
                starts.append(0)
                ends.append(nbytes)
            continue
        first = len(piece_payloads)
        for span in split_payload(nbytes, payload.itemsize, chunk_bytes):
            piece_payloads.append(index)
            starts.append(span.start)
            ends.append(span.end)
        split.append((index, first, len(piece_payloads)))
    local_count = len(piece_payloads)
    order = sorted(
        range(len(shared_keys)),
        key=lambda i: -1 if (key := shared_keys[i]).shard_offsets is None else decision.sharded_position(key),
    )
    for i in order:
        piece_payloads.append(shared[i].payload)
        starts.append(shared[i].start)
        ends.append(shared[i].end)
    shared_keys = [shared_keys[i] for i in order]
    # Rank-local pieces first, then the shared ones: slot i is piece i.
    packed = pack_columns(piece_payloads, starts, ends, rank=rank, take_id="", data_object_bytes=data_object_bytes)
    slots: dict[int, tuple[PieceSlot, ...]] = dict.fromkeys(owned, ())
    for slot in packed.slots[:local_count]:
        slots[slot.payload] = (slot,)
    for index, first, end in split:
        slots[index] = packed.slots[first:end]
    shared_slots = dict(zip(shared_keys, packed.slots[local_count:], strict=True))
    return FixedPlan(
        rank,
        entries,
        primitives,
        replicated_primitives,
        packed.data_objects,
        slots,
        shared_slots,
        tuple(sorted(serialized)),
    )


def finish_plan(
    fixed: FixedPlan, local: LocalState, *, take_id: str, chunk_bytes: int, data_object_bytes: int
) -> TakePlan:
    """The plan of a take of ``local`` (described like the state ``fixed`` was planned for): its
    primitive values, its serialized bytes packed after the fixed pieces, every data object named
    with ``take_id``. Costs O(data objects + primitives + serialized payloads), not O(entries)."""
    rank = fixed.rank
    entries = dict(fixed.entries)
    leaves = local.leaves
    for key, path in fixed.primitives.items():
        entries[key] = _primitive(leaves[path])
    for key, path in fixed.replicated_primitives.items():
        entries[key] = PrimitiveEntry.of(_primitive(leaves[path]).value, True)
    named = tuple(
        DataObjectPlan(data_object_location(rank, index, take_id), plan.slots, plan.nbytes)
        for index, plan in enumerate(fixed.data_objects)
    )
    pieces = [
        PayloadSpan.of(index, span)
        for index in fixed.serialized
        for span in split_payload(local.payloads[index].nbytes, local.payloads[index].itemsize, chunk_bytes)
    ]
    packed = pack_pieces(
        pieces, rank=rank, take_id=take_id, data_object_bytes=data_object_bytes, first_index=len(named)
    )
    slots = dict(fixed.slots)
    per_payload: dict[int, list[PieceSlot]] = {index: [] for index in fixed.serialized}
    for slot in packed.slots:
        per_payload[slot.payload].append(slot)
    slots.update((i, tuple(s)) for i, s in per_payload.items())
    return TakePlan(rank, entries, named + packed.data_objects, slots, fixed.shared_slots)


def _primitive(leaf: object) -> PrimitiveEntry:
    if not isinstance(leaf, PrimitiveEntry):  # the caller checked the structure: a bug if reached
        raise TypeError(f"finish_plan: a primitive became a {type(leaf).__name__}; the structure changed")
    return leaf
