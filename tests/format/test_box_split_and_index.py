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
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(0, 4096)) for _ in range(ndim))
    offsets, sizes = [], []
    for extent in shape:
        start = draw(st.integers(0, extent))
        offsets.append(start)
        sizes.append(draw(st.integers(0, extent - start)))
    return Box(tuple(offsets), tuple(sizes)), shape, draw(st.sampled_from([1, 2, 4, 8]))


def _elements(box: Box) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(o, o + n) for o, n in zip(box.offsets, box.sizes, strict=True))))


@settings(max_examples=300, deadline=None)
@given(_box_of_a_shape())
def test_sub_boxes_are_disjoint_cover_the_box_and_keep_the_minimum(case: tuple[Box, tuple[int, ...], int]) -> None:
    box, shape, itemsize = case
    parts = column_split(box, shape, itemsize)
    assert 1 <= len(parts) <= sharded.COLUMN_SPLIT_MAX_PARTS
    if len(parts) == 1:
        assert parts == [box]
        return
    # split along one dim > 0 where the box is narrower than the tensor, into contiguous slices in order
    (dim,) = {d for part in parts for d in range(len(shape)) if part.sizes[d] != box.sizes[d]}
    assert dim > 0 and box.sizes[dim] < shape[dim]
    assert all(box.sizes[d] == shape[d] for d in range(1, dim))  # the first narrower dim
    assert parts[0].offsets == box.offsets
    for before, after in itertools.pairwise(parts):
        assert after.offsets[dim] == before.offsets[dim] + before.sizes[dim]
    assert sum(part.sizes[dim] for part in parts) == box.sizes[dim]
    for part in parts:
        assert math.prod(part.sizes) * itemsize >= sharded.COLUMN_SPLIT_MIN_BYTES
    assert column_split(box, shape, itemsize) == parts  # every rank holding the box splits it alike


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_small_boxes_of_many_ranks_are_not_split(rows: int, columns: int, ranks: int) -> None:
    shape = (rows, columns * ranks)
    boxes = [Box((0, r * columns), (rows, columns)) for r in range(ranks)]
    assert all(column_split(box, shape, 8) == [box] for box in boxes)  # at most 32 KiB each


def test_a_box_split_exactly_where_the_bytes_allow() -> None:
    mib = sharded.COLUMN_SPLIT_MIN_BYTES
    box = Box((0, 1024), (256, 1024))  # float32: 1 MiB
    assert column_split(box, (256, 4096), 4) == [box]
    wide = Box((0, 8192), (256, 8192))  # 8 MiB: 8 sub-boxes of 1 MiB
    parts = column_split(wide, (256, 32768), 4)
    assert [p.offsets for p in parts] == [(0, 8192 + 1024 * i) for i in range(8)]
    assert {math.prod(p.sizes) * 4 for p in parts} == {mib}
    assert column_split(Box((0, 0), (256, 32768)), (256, 32768), 4) == [Box((0, 0), (256, 32768))]  # full width
    assert len(column_split(Box((0, 0), (3 * 256, 3)), (3 * 256, 6), 1 << 11)) == 3  # 3 columns of 1.5 MiB


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
