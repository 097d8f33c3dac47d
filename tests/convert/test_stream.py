"""Copying pieces into a file: where a stored box's elements land in the global tensor."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit._format.sharded import Box
from snapshotkit.convert._stream import box_runs


@st.composite
def _boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], Box, int, int]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    offsets, sizes = [], []
    for size in shape:
        start = draw(st.integers(0, size - 1))
        offsets.append(start)
        sizes.append(draw(st.integers(1, size - start)))
    numel = math.prod(sizes)
    first = draw(st.integers(0, numel))
    stop = draw(st.integers(first, numel))
    return shape, Box(tuple(offsets), tuple(sizes)), first, stop


@settings(max_examples=300, deadline=None)
@given(_boxes())
def test_box_runs_cover_exactly_the_box_elements_in_order(case: tuple[tuple[int, ...], Box, int, int]) -> None:
    shape, box, first, stop = case
    indices = np.arange(math.prod(shape)).reshape(shape)
    region = indices[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.sizes))] if shape else indices
    wanted = region.reshape(-1)[first:stop].tolist()
    runs = list(box_runs(shape, box, first, stop))
    got = [index for start, count in runs for index in range(start, start + count)]
    assert got == wanted
    assert all(count > 0 for _, count in runs)


def test_one_run_per_piece_when_only_dim_0_is_cut() -> None:
    assert list(box_runs((10, 4, 3), Box((2, 0, 0), (5, 4, 3)), 0, 60)) == [(24, 60)]
    assert list(box_runs((10, 4), Box((0, 1), (2, 2)), 0, 4)) == [(1, 2), (5, 2)]
