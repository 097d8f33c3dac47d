"""Column sub-boxes of a stored shard box, and the index a restore finds overlapping boxes with."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit._format import sharded
from snapshotkit._format.box_index import BoxIndex
from snapshotkit._format.sharded import Box, column_split, overlap


@st.composite
def _box_of_a_shape(draw: st.DrawFn) -> tuple[Box, tuple[int, ...], int]:
    """A box of a tensor of up to 3 dims, often full-width (``Shard(0)``) and often large."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.one_of(st.integers(0, 64), st.integers(0, 1 << 14))) for _ in range(ndim))
    offsets, sizes = [], []
    for d, extent in enumerate(shape):
        if d > 0 and draw(st.booleans()):  # full along this dim
            offsets.append(0)
            sizes.append(extent)
            continue
        start = draw(st.integers(0, extent))
        offsets.append(start)
        sizes.append(draw(st.integers(0, extent - start)))
    return Box(tuple(offsets), tuple(sizes)), shape, draw(st.sampled_from([1, 2, 4, 8]))


def _elements(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(o, o + n) for o, n in zip(box.offsets, box.sizes, strict=True))))


@settings(max_examples=500, deadline=None)
@given(_box_of_a_shape())
def test_sub_boxes_are_disjoint_cover_the_box_and_keep_the_minimum(case: tuple[Box, tuple[int, ...], int]) -> None:
    box, shape, itemsize = case
    parts = column_split(box, shape, itemsize)
    assert 1 <= len(parts) <= sharded.COLUMN_SPLIT_MAX_PARTS
    if len(parts) == 1:
        assert parts == [box]
        return
    # disjoint, inside the box, and as many elements as the box: they cover it exactly
    for a, b in itertools.combinations(parts, 2):
        assert overlap(a, b) is None
    assert all(overlap(part, box) == part for part in parts)
    assert sum(math.prod(part.sizes) for part in parts) == math.prod(box.sizes)
    # contiguous slices in order along one dim > 0: the first narrower dim, else dim 1 (full width)
    (dim,) = {d for part in parts for d in range(len(shape)) if part.sizes[d] != box.sizes[d]}
    narrow = [d for d in range(1, len(shape)) if box.sizes[d] < shape[d]]
    assert dim == (narrow[0] if narrow else 1)
    assert parts[0].offsets == box.offsets
    for before, after in itertools.pairwise(parts):
        assert after.offsets[dim] == before.offsets[dim] + before.sizes[dim]
    least = sharded.COLUMN_SPLIT_MIN_BYTES if narrow else sharded.FULL_WIDTH_SPLIT_MIN_BYTES
    for part in parts:
        assert math.prod(part.sizes) * itemsize >= least


@settings(max_examples=300, deadline=None)
@given(_box_of_a_shape(), st.data())
def test_the_split_depends_on_the_sizes_only(case: tuple[Box, tuple[int, ...], int], data: st.DataObject) -> None:
    """Every rank holding a box splits it alike, and a box elsewhere of the same sizes alike, shifted
    (the take, the first take's exchange and plan reuse rely on it)."""
    box, shape, itemsize = case
    parts = column_split(box, shape, itemsize)
    assert column_split(Box(box.offsets, box.sizes), tuple(shape), itemsize) == parts
    shift = tuple(data.draw(st.integers(-o, n - o - s)) for o, s, n in zip(box.offsets, box.sizes, shape, strict=True))
    moved = Box(tuple(o + d for o, d in zip(box.offsets, shift, strict=True)), box.sizes)
    shifted = [Box(tuple(o + d for o, d in zip(p.offsets, shift, strict=True)), p.sizes) for p in parts]
    assert column_split(moved, shape, itemsize) == shifted


def test_small_sub_boxes_cover_every_element_once() -> None:
    box, shape = Box((3, 0, 2), (5, 7, 9)), (11, 7, 11)  # narrow along dim 2
    saved = sharded.COLUMN_SPLIT_MIN_BYTES, sharded.FULL_WIDTH_SPLIT_MIN_BYTES
    sharded.COLUMN_SPLIT_MIN_BYTES = sharded.FULL_WIDTH_SPLIT_MIN_BYTES = 8
    try:
        for whole, of in ((box, shape), (Box((3, 0, 0), (5, 7, 11)), shape)):  # and a full-width box
            parts = column_split(whole, of, 1)
            assert len(parts) > 1
            elements = [_elements(part) for part in parts]
            assert sum(len(e) for e in elements) == len(set().union(*elements)) == len(_elements(whole))
            assert set().union(*elements) == _elements(whole)
    finally:
        sharded.COLUMN_SPLIT_MIN_BYTES, sharded.FULL_WIDTH_SPLIT_MIN_BYTES = saved


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_small_boxes_of_many_ranks_are_not_split(rows: int, columns: int, ranks: int) -> None:
    shape = (rows, columns * ranks)
    boxes = [Box((0, r * columns), (rows, columns)) for r in range(ranks)]
    assert all(column_split(box, shape, 8) == [box] for box in boxes)  # at most 32 KiB each
    rows_boxes = [Box((r * rows, 0), (rows, columns)) for r in range(ranks)]  # Shard(0)
    assert all(column_split(box, (rows * ranks, columns), 8) == [box] for box in rows_boxes)


def test_a_box_split_exactly_where_the_bytes_allow() -> None:
    mib = sharded.COLUMN_SPLIT_MIN_BYTES
    box = Box((0, 1024), (256, 1024))  # float32: 1 MiB
    assert column_split(box, (256, 4096), 4) == [box]
    wide = Box((0, 8192), (256, 8192))  # 8 MiB: 8 sub-boxes of 1 MiB
    parts = column_split(wide, (256, 32768), 4)
    assert [p.offsets for p in parts] == [(0, 8192 + 1024 * i) for i in range(8)]
    assert {math.prod(p.sizes) * 4 for p in parts} == {mib}
    assert len(column_split(Box((0, 0), (3 * 256, 3)), (3 * 256, 6), 1 << 11)) == 3  # 3 columns of 1.5 MiB


def test_a_full_width_box_is_split_into_parts_of_at_least_16_mib() -> None:
    full = Box((0, 0), (256, 32768))  # float32, full width: 32 MiB, 2 parts of 16 MiB
    assert column_split(full, (256, 32768), 4) == [Box((0, 0), (256, 16384)), Box((0, 16384), (256, 16384))]
    assert column_split(Box((0, 0), (255, 32768)), (512, 32768), 4) == [Box((0, 0), (255, 32768))]  # < 32 MiB
    # the benchmark's table: 4 x Shard(0) boxes of [16384, 4096] float32 (256 MiB), 8 parts of 32 MiB,
    # so Shard(1) on 2 ranks (2,048 columns each) needs exactly 4 parts of each box
    table = column_split(Box((16384, 0), (16384, 4096)), (65536, 4096), 4)
    assert table == [Box((16384, 512 * i), (16384, 512)) for i in range(8)]
    assert column_split(Box((0,), (1 << 30,)), (1 << 30,), 4) == [Box((0,), (1 << 30,))]  # 1-d: never split
    assert column_split(Box((0, 0, 0), (1 << 20, 1, 64)), (1 << 20, 1, 64), 4) == [Box((0, 0, 0), (1 << 20, 1, 64))]


@st.composite
def _grid(draw: st.DrawFn) -> tuple[list[Box], tuple[int, ...]]:
    """Disjoint boxes covering a 2-d tensor: a grid, with uneven cuts along each dim."""
    cuts = []
    for _ in range(2):
        extent = draw(st.integers(1, 60))
        inner = sorted(draw(st.sets(st.integers(1, extent - 1), max_size=12))) if extent > 1 else []
        cuts.append([0, *inner, extent])
    boxes = [
        Box((r0, c0), (r1 - r0, c1 - c0))
        for r0, r1 in itertools.pairwise(cuts[0])
        for c0, c1 in itertools.pairwise(cuts[1])
    ]
    order = draw(st.permutations(range(len(boxes))))
    return [boxes[i] for i in order], (cuts[0][-1], cuts[1][-1])


@settings(max_examples=200, deadline=None)
@given(_grid(), st.data())
def test_index_finds_exactly_the_overlapping_boxes(
    grid: tuple[list[Box], tuple[int, ...]], data: st.DataObject
) -> None:
    boxes, shape = grid
    index = BoxIndex(boxes)
    for _ in range(5):
        start = [data.draw(st.integers(0, n)) for n in shape]
        wanted = Box(tuple(start), tuple(data.draw(st.integers(0, n - s)) for s, n in zip(start, shape, strict=True)))
        expected = [i for i, box in enumerate(boxes) if overlap(box, wanted) is not None]
        assert index.overlapping(wanted) == expected


def test_index_of_many_row_boxes_looks_at_few() -> None:
    boxes = [Box((r * 4, 0), (4, 16)) for r in range(16384)]
    index = BoxIndex(boxes)
    assert index.overlapping(Box((4 * 100 + 2, 3), (8, 2))) == [100, 101, 102]
    assert index.overlapping(Box((0, 0), (0, 16))) == []
    columns = BoxIndex([Box((0, c * 4), (16, 4)) for c in range(64)])  # Shard(1): indexed by dim 1
    assert columns.overlapping(Box((0, 10), (16, 8))) == [2, 3, 4]
