"""A rank's write layout of its local payloads, built as a take builds it (shared by tests)."""

from __future__ import annotations

from snapshotkit._plan.layout import DataObjectPlan, PayloadSpan, PieceSlot, pack_pieces, split_payload


def plan_layout(
    sizes: list[int], itemsizes: list[int], *, rank: int, take_id: str, chunk_bytes: int, data_object_bytes: int
) -> tuple[list[DataObjectPlan], list[list[PieceSlot]]]:
    """Every payload split into pieces and packed, with each payload's slots (as a take lays out local state)."""
    pieces = [
        PayloadSpan.of(index, span)
        for index, (nbytes, itemsize) in enumerate(zip(sizes, itemsizes, strict=True))
        for span in split_payload(nbytes, itemsize, chunk_bytes)
    ]
    packed = pack_pieces(pieces, rank=rank, take_id=take_id, data_object_bytes=data_object_bytes)
    per_payload: list[list[PieceSlot]] = [[] for _ in sizes]
    for slot in packed.slots:
        per_payload[slot.payload].append(slot)
    return list(packed.data_objects), per_payload
