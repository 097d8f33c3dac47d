"""The planner of a rank's take before the first-take work of issue 27 (``fix_plan`` with a
``PayloadSpan`` per piece and ``pack_pieces`` packing them), kept verbatim as the reference the
column packer (:func:`snapshotkit._plan.layout.pack_columns`) and :func:`snapshotkit._plan.rank_plan.fix_plan`
are compared with (``tests/plan/test_rank_plan_reference.py``). Only this docstring and the imports
differ."""

from __future__ import annotations

from collections.abc import Sequence

from snapshotkit._format.entries import PrimitiveEntry
from snapshotkit._format.serialization import RAW
from snapshotkit._plan.decide import Decision, PieceKey
from snapshotkit._plan.layout import (
    ALIGNMENT_BYTES,
    DataObjectPlan,
    PackedLayout,
    PayloadSpan,
    PieceSlot,
    data_object_location,
    split_payload,
)
from snapshotkit._plan.leaves import LocalState, ObjectLeaf, ShardedLeaf, TensorLeaf
from snapshotkit._plan.rank_plan import (
    FixedPlan,
    PendingEntry,
    PendingObject,
    PendingReplicated,
    PendingSharded,
    PendingTensor,
)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def pack_pieces(
    pieces: Sequence[PayloadSpan],
    *,
    rank: int,
    take_id: str,
    data_object_bytes: int,
    alignment: int = ALIGNMENT_BYTES,
    first_index: int = 0,
) -> PackedLayout:
    """Pack pieces, in the order given, into data objects of about ``data_object_bytes``.

    Each slot starts at the first multiple of ``alignment`` after the previous slot of its data
    object. A piece that would end past ``data_object_bytes`` starts a new data object, unless
    the current one is empty: a data object exceeds ``data_object_bytes`` only when it holds a
    single piece. Data objects are named :func:`data_object_location` ``(rank, first_index,
    take_id)``, ``(rank, first_index + 1, take_id)``, ... in write order (slots carry the same
    indices); each holds at least one piece.
    """
    objects: list[DataObjectPlan] = []
    slots: list[PieceSlot] = []
    current: list[PieceSlot] = []
    index = first_index
    offset = 0

    def close_object() -> None:
        nonlocal current, index, offset
        if current:
            objects.append(DataObjectPlan(data_object_location(rank, index, take_id), tuple(current), offset))
            index += 1
            current = []
            offset = 0

    for piece in pieces:
        slot_offset = _align_up(offset, alignment)
        if current and slot_offset + piece.nbytes > data_object_bytes:
            close_object()
            slot_offset = 0
        slot = PieceSlot(piece.payload, piece.start, piece.end, index, slot_offset)
        current.append(slot)
        slots.append(slot)
        offset = slot_offset + piece.nbytes
    close_object()
    return PackedLayout(tuple(objects), tuple(slots))


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

    for path, leaf in local.leaves.items():
        key = f"{rank}/{path}"
        if isinstance(leaf, ShardedLeaf):
            for shard in leaf.boxes:
                take_mine(path, shard.payload, shard.box.offsets)
            if rank == 0:
                entries[key] = PendingSharded(path)
        elif path in decision.replicated:
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
    local_pieces = [
        PayloadSpan.of(index, span)
        for index in sorted(local_payloads)
        for span in split_payload(local.payloads[index].nbytes, local.payloads[index].itemsize, chunk_bytes)
    ]
    # IMPORTANT: the shared pieces in the decision's order (replicated ones, then sharded ones by
    # Decision.sharded_position): merge_results places a rank's sharded pieces by that order alone.
    order = sorted(
        range(len(shared_keys)),
        key=lambda i: -1 if (key := shared_keys[i]).shard_offsets is None else decision.sharded_position(key),
    )
    shared = [shared[i] for i in order]
    shared_keys = [shared_keys[i] for i in order]
    # Rank-local pieces first, then the shared ones: slot i is piece i.
    packed = pack_pieces(local_pieces + shared, rank=rank, take_id="", data_object_bytes=data_object_bytes)
    per_payload: dict[int, list[PieceSlot]] = {index: [] for index in local_payloads}
    for slot in packed.slots[: len(local_pieces)]:
        per_payload[slot.payload].append(slot)
    shared_slots = dict(zip(shared_keys, packed.slots[len(local_pieces) :], strict=True))
    slots = {i: tuple(s) for i, s in per_payload.items()}
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
