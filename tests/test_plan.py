from __future__ import annotations

import random

import pytest

from snapshotkit._plan.layout import (
    ALIGNMENT_BYTES,
    DataObjectPlan,
    PieceSlot,
    data_object_location,
    pack_pieces,
    split_payload,
)
from snapshotkit._plan.reads import RangeRequest, plan_read_batches


def plan_layout(
    sizes: list[int], itemsizes: list[int], *, rank: int, take_id: str, chunk_bytes: int, data_object_bytes: int
) -> tuple[list[DataObjectPlan], list[list[PieceSlot]]]:
    """Every payload split into pieces and packed, with each payload's slots (as a take lays out local state)."""
    pieces = [
        (index, start, end)
        for index, (nbytes, itemsize) in enumerate(zip(sizes, itemsizes, strict=True))
        for start, end in split_payload(nbytes, itemsize, chunk_bytes)
    ]
    objects, slots = pack_pieces(pieces, rank=rank, take_id=take_id, data_object_bytes=data_object_bytes)
    per_payload: list[list[PieceSlot]] = [[] for _ in sizes]
    for slot in slots:
        per_payload[slot.payload].append(slot)
    return objects, per_payload


def test_split_payload_respects_chunk_and_element_boundaries() -> None:
    assert split_payload(0, 4, 16) == []
    assert split_payload(10, 1, 4) == [(0, 4), (4, 8), (8, 10)]
    # 6-byte elements, 16-byte chunks: pieces of 12 bytes (two elements)
    assert split_payload(30, 6, 16) == [(0, 12), (12, 24), (24, 30)]
    # element larger than the chunk: one element per piece
    assert split_payload(32, 16, 8) == [(0, 16), (16, 32)]


def test_layout_packs_small_payloads_and_chunks_large_ones() -> None:
    sizes = [100, 3, 50, 1000, 0, 7]
    objects, slots = plan_layout(
        sizes, [1] * len(sizes), rank=2, take_id="cafe0123", chunk_bytes=400, data_object_bytes=512
    )
    # every payload byte lands exactly once, in order
    for index, size in enumerate(sizes):
        covered = [(s.start, s.end) for s in slots[index]]
        assert covered == split_payload(size, 1, 400)
    assert slots[4] == []
    for plan in objects:
        assert plan.location.startswith("data/2_")
        previous_end = 0
        for slot in plan.slots:
            assert slot.offset % ALIGNMENT_BYTES == 0
            assert slot.offset >= previous_end
            previous_end = slot.offset + slot.nbytes
        assert plan.nbytes == previous_end
        # a data object exceeds the target only when it holds a single piece
        assert plan.nbytes <= 512 or len(plan.slots) == 1
    assert [p.location for p in objects] == [data_object_location(2, i, "cafe0123") for i in range(len(objects))]
    assert objects[0].location == "data/2_00000_cafe0123"


def test_layout_is_deterministic() -> None:
    rng = random.Random(0)
    sizes = [rng.randrange(0, 10_000) for _ in range(500)]
    first = plan_layout(sizes, [4] * 500, rank=0, take_id="t", chunk_bytes=4096, data_object_bytes=65536)
    second = plan_layout(sizes, [4] * 500, rank=0, take_id="t", chunk_bytes=4096, data_object_bytes=65536)
    assert first == second


def test_read_batches_merge_close_requests_only() -> None:
    requests = [
        RangeRequest("a", 0, 100, 0),
        RangeRequest("a", 128, 200, 1),  # gap 28: merged
        RangeRequest("a", 10_000, 10_100, 2),  # far: new batch
        RangeRequest("b", 0, 10, 3),  # other object
        RangeRequest("a", 0, 100, 4),  # same bytes again: never merged into an overlapping batch
    ]
    batches = plan_read_batches(requests, max_batch_bytes=1 << 20, max_gap_bytes=64)
    layout = sorted((b.location, b.start, b.end, tuple(r.tag for r in b.requests)) for b in batches)
    assert layout == [
        ("a", 0, 100, (0,)),
        ("a", 0, 200, (4, 1)),
        ("a", 10_000, 10_100, (2,)),
        ("b", 0, 10, (3,)),
    ] or layout == [
        ("a", 0, 100, (4,)),
        ("a", 0, 200, (0, 1)),
        ("a", 10_000, 10_100, (2,)),
        ("b", 0, 10, (3,)),
    ]
    for batch in batches:
        ends = [r.end for r in batch.requests]
        starts = [r.start for r in batch.requests]
        assert all(e <= s for e, s in zip(ends, starts[1:]))


@pytest.mark.parametrize("max_batch", [1, 150, 1 << 20])
def test_read_batches_respect_max_size(max_batch: int) -> None:
    requests = [RangeRequest("x", i * 100, i * 100 + 100, i) for i in range(50)]
    batches = plan_read_batches(requests, max_batch_bytes=max_batch, max_gap_bytes=0)
    assert sorted(t for b in batches for t in (r.tag for r in b.requests)) == list(range(50))
    for batch in batches:
        assert batch.nbytes <= max(max_batch, 100)
