"""One rank's take plan: its manifest entries-to-be and the data objects it writes.

Given the shared :class:`~snapshotkit._plan.decide.Decision`, a rank writes its rank-local
payloads and the replicated/sharded pieces the decision gave it, packed into data objects by
:func:`~snapshotkit._plan.layout.pack_pieces`. Entries whose pieces are not known until the
writes finished (checksums) or that other ranks help write are *pending* until
:mod:`snapshotkit._plan.merge` turns them into manifest entries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from snapshotkit._format.entries import Entry, PrimitiveEntry
from snapshotkit._plan.decide import Decision, PieceKey
from snapshotkit._plan.layout import DataObjectPlan, PayloadSpan, PieceSlot, pack_pieces, split_payload
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
        data_objects: the data objects to write, in order.
        slots: rank-local payload index -> the slots holding its pieces, in order.
        shared_slots: replicated/sharded piece -> its slot, for the pieces this rank writes.
    """

    rank: int
    entries: Mapping[str, PendingEntry]
    data_objects: tuple[DataObjectPlan, ...]
    slots: Mapping[int, tuple[PieceSlot, ...]]
    shared_slots: Mapping[PieceKey, PieceSlot]

    @property
    def nbytes(self) -> int:
        return sum(plan.nbytes for plan in self.data_objects)


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
    entries: dict[str, PendingEntry] = {f"{rank}/{path}": c for path, c in local.containers.items()}
    shared: list[PayloadSpan] = []
    shared_keys: list[PieceKey] = []
    local_payloads: set[int] = set()

    def take_mine(keys: list[PieceKey], payload: int) -> None:
        for key in keys:
            if decision.owner[key] == rank:
                shared.append(PayloadSpan.of(payload, decision.spans[key]))
                shared_keys.append(key)

    for path, leaf in local.leaves.items():
        key = f"{rank}/{path}"
        if isinstance(leaf, ShardedLeaf):
            for shard in leaf.boxes:
                take_mine(decision.pieces(path, shard.box.offsets), shard.payload)
            if rank == 0:
                entries[key] = PendingSharded(path)
        elif path in decision.replicated:
            if isinstance(leaf, PrimitiveEntry):
                if rank == 0:
                    entries[key] = PrimitiveEntry.of(leaf.value, True)
                continue
            assert isinstance(leaf, (TensorLeaf, ObjectLeaf))
            alias = leaf.alias_of if isinstance(leaf, TensorLeaf) else None
            if alias is None:
                take_mine(decision.pieces(path), leaf.payload)
            if rank == 0:
                entries[key] = PendingReplicated(alias or path, leaf)
        elif isinstance(leaf, PrimitiveEntry):
            entries[key] = leaf
        elif isinstance(leaf, TensorLeaf):
            entries[key] = PendingTensor(leaf.payload, leaf.dtype, leaf.shape, leaf.serializer)
            local_payloads.add(leaf.payload)
        else:
            assert isinstance(leaf, ObjectLeaf)
            entries[key] = PendingObject(leaf.payload, leaf.obj_type)
            local_payloads.add(leaf.payload)
    local_pieces = [
        PayloadSpan.of(index, span)
        for index in sorted(local_payloads)
        for span in split_payload(local.payloads[index].nbytes, local.payloads[index].itemsize, chunk_bytes)
    ]
    # Rank-local pieces first, then the shared ones: slot i is piece i.
    packed = pack_pieces(local_pieces + shared, rank=rank, take_id=take_id, data_object_bytes=data_object_bytes)
    per_payload: dict[int, list[PieceSlot]] = {index: [] for index in local_payloads}
    for slot in packed.slots[: len(local_pieces)]:
        per_payload[slot.payload].append(slot)
    shared_slots = dict(zip(shared_keys, packed.slots[len(local_pieces) :], strict=True))
    return TakePlan(rank, entries, packed.data_objects, {i: tuple(s) for i, s in per_payload.items()}, shared_slots)
