"""A DTensor's boxes from its mesh and placements (``_plan/grid.py``), against torch's own."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from snapshotkit._format.sharded import Box
from snapshotkit._plan.grid import REPLICATE, Grid, grid_box, grid_boxes


@st.composite
def grids(draw: st.DrawFn) -> Grid:
    """Uneven and empty shards included; several mesh dims may shard one tensor dim (nested)."""
    shape = tuple(draw(st.lists(st.integers(0, 11), min_size=1, max_size=3)))
    mesh_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    dims = tuple(draw(st.sampled_from([REPLICATE, *range(len(shape))])) for _ in mesh_shape)
    ranks = tuple(draw(st.permutations(range(math.prod(mesh_shape)))))
    return Grid(mesh_shape, ranks, dims, shape)


def torch_box(grid: Grid, coordinate: tuple[int, ...]) -> Box:
    placements = [Replicate() if dim == REPLICATE else Shard(dim) for dim in grid.shard_dims]
    sizes, offsets = _compute_local_shape_and_global_offset(grid.shape, grid.mesh_shape, list(coordinate), placements)
    return Box(tuple(offsets), tuple(sizes))


@settings(max_examples=300, deadline=None, database=None)
@given(grid=grids())
def test_every_position_holds_the_box_torch_gives_it(grid: Grid) -> None:
    boxes = grid_boxes(grid)
    for position, coordinate in enumerate(itertools.product(*map(range, grid.mesh_shape))):
        expected = torch_box(grid, coordinate)
        assert grid_box(grid, position) == expected
        assert (tuple(boxes.offsets[position].tolist()), tuple(boxes.sizes[position].tolist())) == (
            expected.offsets,
            expected.sizes,
        )


def test_a_rank_finds_its_position_by_its_global_rank() -> None:
    grid = Grid((2, 2), (4, 5, 6, 7), (0, REPLICATE), (4,))
    assert [grid.position(rank) for rank in (4, 7, 0)] == [0, 3, None]
    assert grid_box(grid, 2) == Box((2,), (2,))  # the second row of the mesh: rows 2-3


def test_equal_grids_hash_alike_and_pickle() -> None:
    import pickle

    grid = Grid((8,), tuple(range(8)), (0,), (64, 3))
    assert hash(pickle.loads(pickle.dumps(grid))) == hash(grid) == hash(Grid((8,), tuple(range(8)), (0,), (64, 3)))
