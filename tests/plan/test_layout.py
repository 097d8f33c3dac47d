"""The write layout (``_plan/layout.py``): cutting payloads into pieces and packing pieces into data objects."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan._layouts import plan_layout
from snapshotkit._plan.layout import (
    ALIGNMENT_BYTES,
    DataObjectPlan,
    PackedLayout,
    PayloadSpan,
    PieceSlot,
    Span,
    data_object_location,
    pack_pieces,
    row_pieces,
    split_payload,
)

# Many examples, each cheap; no example database (nothing is written into the checkout).
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

chunk_sizes = st.integers(min_value=1, max_value=300)
itemsizes = st.sampled_from([1, 2, 4, 8, 16])


def assert_spans_cover(spans: list[Span], nbytes: int) -> None:
    """The spans are non-empty and tile ``[0, nbytes)`` in order: every byte in exactly one span."""
    assert all(span.nbytes > 0 for span in spans)
    assert [span.start for span in spans] == [0, *(span.end for span in spans)][: len(spans)]
    assert (spans[-1].end if spans else 0) == nbytes


# --------------------------------------------------------------------------- split_payload


def test_split_payload_respects_chunk_and_element_boundaries() -> None:
    assert split_payload(0, 4, 16) == []
    assert split_payload(10, 1, 4) == [Span(0, 4), Span(4, 8), Span(8, 10)]
    # 6-byte elements, 16-byte chunks: pieces of 12 bytes (two elements)
    assert split_payload(30, 6, 16) == [Span(0, 12), Span(12, 24), Span(24, 30)]
    # element larger than the chunk: one element per piece
    assert split_payload(32, 16, 8) == [Span(0, 16), Span(16, 32)]


def test_split_payload_edges() -> None:
    assert split_payload(16, 4, 16) == [Span(0, 16)]  # exactly one chunk: not split
    assert split_payload(17, 1, 16) == [Span(0, 16), Span(16, 17)]
    # a serialized blob is one element (itemsize = its size): never split, whatever the chunk
    assert split_payload(1000, 1000, 64) == [Span(0, 1000)]
    assert split_payload(1, 1, 1) == [Span(0, 1)]
    assert Span(3, 10).nbytes == 7
    assert PayloadSpan.of(5, Span(3, 10)) == PayloadSpan(5, 3, 10)
    assert PayloadSpan(5, 3, 10).nbytes == 7


@FAST
@given(count=st.integers(0, 200), itemsize=itemsizes, chunk_bytes=chunk_sizes)
def test_split_payload_cuts_whole_elements_within_the_chunk(count: int, itemsize: int, chunk_bytes: int) -> None:
    nbytes = count * itemsize
    spans = split_payload(nbytes, itemsize, chunk_bytes)
    assert_spans_cover(spans, nbytes)
    largest = max(chunk_bytes - chunk_bytes % itemsize, itemsize)  # whole elements, at least one
    for span in spans:
        assert span.start % itemsize == 0
        assert span.nbytes % itemsize == 0
        assert span.nbytes <= largest
    # as few pieces as that allows: every piece but the last is as large as it may be
    assert all(span.nbytes == largest for span in spans[:-1]) or len(spans) == 1


@FAST
@given(nbytes=st.integers(0, 5000), itemsize=itemsizes, chunk_bytes=chunk_sizes)
def test_split_payload_covers_any_size(nbytes: int, itemsize: int, chunk_bytes: int) -> None:
    spans = split_payload(nbytes, itemsize, chunk_bytes)
    assert_spans_cover(spans, nbytes)
    assert all(span.nbytes <= max(chunk_bytes, itemsize) for span in spans)
    assert split_payload(nbytes, itemsize, chunk_bytes) == spans  # deterministic


# --------------------------------------------------------------------------- row_pieces


def test_row_pieces_edges() -> None:
    assert row_pieces((), 4, 16) == [Span(0, 4)]  # 0-d: one element
    assert row_pieces((), 8, 4) == [Span(0, 8)]  # 0-d, element larger than the chunk
    assert row_pieces((0, 5), 4, 16) == []  # no rows
    assert row_pieces((3, 0), 4, 16) == []  # rows of no elements
    assert row_pieces((3, 2, 0), 4, 16) == []
    # 8-byte rows, 20-byte chunks: two rows a piece
    assert row_pieces((5, 2), 4, 20) == [Span(0, 16), Span(16, 32), Span(32, 40)]
    # a row larger than the chunk is a piece of its own
    assert row_pieces((3, 100), 4, 16) == [Span(0, 400), Span(400, 800), Span(800, 1200)]
    assert row_pieces((7,), 2, 1 << 20) == [Span(0, 14)]


@FAST
@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple),
    itemsize=itemsizes,
    chunk_bytes=chunk_sizes,
)
def test_row_pieces_are_whole_row_blocks(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> None:
    row_bytes = itemsize
    for size in shape[1:]:
        row_bytes *= size
    nbytes = row_bytes * shape[0]
    spans = row_pieces(shape, itemsize, chunk_bytes)
    assert_spans_cover(spans, nbytes)
    rows_per_piece = max(1, chunk_bytes // row_bytes) if row_bytes else 0
    for span in spans:
        assert span.start % row_bytes == 0
        assert span.nbytes % row_bytes == 0
        assert span.nbytes <= chunk_bytes or span.nbytes == row_bytes  # within the chunk, or one row
    assert all(span.nbytes == rows_per_piece * row_bytes for span in spans[:-1])


# --------------------------------------------------------------------------- pack_pieces


def test_pack_nothing() -> None:
    assert pack_pieces([], rank=0, take_id="t", data_object_bytes=100) == PackedLayout((), ())
    objects, slots = plan_layout([], [], rank=0, take_id="t", chunk_bytes=10, data_object_bytes=10)
    assert objects == []
    assert slots == []


def test_pack_a_piece_larger_than_a_data_object() -> None:
    packed = pack_pieces(
        [PayloadSpan(0, 0, 10), PayloadSpan(1, 0, 1000), PayloadSpan(2, 0, 10)],
        rank=3,
        take_id="t",
        data_object_bytes=100,
    )
    location = [data_object_location(3, i, "t") for i in range(3)]
    assert packed.slots == (
        PieceSlot(0, 0, 10, 0, 0),
        PieceSlot(1, 0, 1000, 1, 0),  # alone, over the target size
        PieceSlot(2, 0, 10, 2, 0),
    )
    assert packed.data_objects == (
        DataObjectPlan(location[0], packed.slots[:1], 10),
        DataObjectPlan(location[1], packed.slots[1:2], 1000),
        DataObjectPlan(location[2], packed.slots[2:], 10),
    )


def test_pack_aligns_every_slot() -> None:
    packed = pack_pieces(
        [PayloadSpan(0, 0, 1), PayloadSpan(0, 1, 2), PayloadSpan(1, 0, 64), PayloadSpan(2, 0, 3)],
        rank=0,
        take_id="t",
        data_object_bytes=1 << 20,
    )
    assert [slot.offset for slot in packed.slots] == [0, 64, 128, 192]
    assert packed.data_objects[0].nbytes == 195  # no padding after the last piece
    custom = pack_pieces(
        [PayloadSpan(0, 0, 5), PayloadSpan(1, 0, 5)], rank=0, take_id="t", data_object_bytes=100, alignment=8
    )
    assert [slot.offset for slot in custom.slots] == [0, 8]


def test_a_piece_that_ends_exactly_at_the_target_size_fits() -> None:
    pieces = [PayloadSpan(0, 0, 64), PayloadSpan(1, 0, 64), PayloadSpan(2, 0, 1)]
    packed = pack_pieces(pieces, rank=0, take_id="t", data_object_bytes=128)
    assert [len(plan.slots) for plan in packed.data_objects] == [2, 1]
    assert packed.data_objects[0].nbytes == 128


def test_data_object_locations() -> None:
    assert data_object_location(0, 0, "cafe") == "data/0_00000_cafe"
    assert data_object_location(12, 34567, "t") == "data/12_34567_t"


def test_layout_packs_small_payloads_and_chunks_large_ones() -> None:
    sizes = [100, 3, 50, 1000, 0, 7]
    objects, slots = plan_layout(
        sizes, [1] * len(sizes), rank=2, take_id="cafe0123", chunk_bytes=400, data_object_bytes=512
    )
    # every payload byte lands exactly once, in order
    for index, size in enumerate(sizes):
        covered = [Span(s.start, s.end) for s in slots[index]]
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


payload_lists = st.lists(st.tuples(st.integers(0, 40), itemsizes), max_size=25)


@FAST
@given(payloads=payload_lists, chunk_bytes=st.integers(1, 200), rank=st.integers(0, 3), data=st.data())
def test_layout_places_every_byte_once_within_the_bounds(
    payloads: list[tuple[int, int]], chunk_bytes: int, rank: int, data: st.DataObject
) -> None:
    sizes = [count * itemsize for count, itemsize in payloads]
    itemsizes_ = [itemsize for _, itemsize in payloads]
    # half the time a data object size that some aligned piece ends exactly on: the edge case
    pieces = {
        span.nbytes for size, itemsize in zip(sizes, itemsizes_) for span in split_payload(size, itemsize, chunk_bytes)
    }
    exact = sorted(ALIGNMENT_BYTES * k + nbytes for k in range(8) for nbytes in pieces if ALIGNMENT_BYTES * k + nbytes)
    data_object_bytes = data.draw(st.integers(1, 600) | (st.sampled_from(exact) if exact else st.nothing()))
    objects, per_payload = plan_layout(
        sizes, itemsizes_, rank=rank, take_id="t", chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes
    )
    # every byte of every payload is in exactly one slot, and slots hold whole elements
    for size, itemsize, slots in zip(sizes, itemsizes_, per_payload):
        assert_spans_cover([Span(s.start, s.end) for s in slots], size)
        assert all(s.start % itemsize == 0 and s.nbytes <= max(chunk_bytes, itemsize) for s in slots)
    # the data objects hold exactly those slots, each once, in order
    assert [s for plan in objects for s in plan.slots] == sorted(
        (s for slots in per_payload for s in slots), key=lambda s: (s.payload, s.start)
    )
    assert [plan.location for plan in objects] == [data_object_location(rank, i, "t") for i in range(len(objects))]
    for index, plan in enumerate(objects):
        assert plan.slots, "no empty data objects"
        end = 0
        for slot in plan.slots:
            assert data_object_location(rank, slot.object_index, "t") == plan.location
            assert slot.offset % ALIGNMENT_BYTES == 0
            assert slot.offset >= end  # slots never overlap
            assert slot.offset - end < ALIGNMENT_BYTES  # only alignment padding between them
            end = slot.offset + slot.nbytes
        assert plan.nbytes == end
        assert plan.nbytes <= data_object_bytes or len(plan.slots) == 1
        if index + 1 < len(objects):
            # greedy: the next object's first piece did not fit after this object's last
            aligned = -(-plan.nbytes // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
            assert aligned + objects[index + 1].slots[0].nbytes > data_object_bytes


@FAST
@given(payloads=payload_lists, chunk_bytes=st.integers(1, 200), data_object_bytes=st.integers(1, 600))
def test_layout_is_a_function_of_its_inputs(
    payloads: list[tuple[int, int]], chunk_bytes: int, data_object_bytes: int
) -> None:
    sizes = [count * itemsize for count, itemsize in payloads]
    itemsizes_ = [itemsize for _, itemsize in payloads]

    def layout() -> object:
        return plan_layout(
            sizes, itemsizes_, rank=1, take_id="t", chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes
        )

    assert layout() == layout()


@FAST
@given(
    pieces=st.lists(st.integers(0, 300), max_size=30),
    data_object_bytes=st.integers(1, 600),
    cut=st.integers(0, 30),
)
def test_packing_a_prefix_places_it_the_same(pieces: list[int], data_object_bytes: int, cut: int) -> None:
    """Pieces are packed in the order given: what comes later never moves what came before."""
    spans = [PayloadSpan(i, 0, nbytes) for i, nbytes in enumerate(pieces)]
    whole = pack_pieces(spans, rank=0, take_id="t", data_object_bytes=data_object_bytes)
    prefix = pack_pieces(spans[:cut], rank=0, take_id="t", data_object_bytes=data_object_bytes)
    assert whole.slots[:cut] == prefix.slots
    assert [(s.payload, s.start, s.end) for s in whole.slots] == [(p.payload, p.start, p.end) for p in spans]
