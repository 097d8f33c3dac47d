"""The exchange's view of every rank (``_plan/gathered.py``): distinct parts once, and sharded
tensors' boxes and holders from explicit boxes or grids alike."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plan._world import StateBuilder
from snapshotkit._format.sharded import Box, column_split
from snapshotkit._plan.decide import decide
from snapshotkit._plan.gathered import Gathered, box_tables
from snapshotkit._plan.grid import REPLICATE, Grid, grid_box
from snapshotkit._plan.leaves import RankInfo, ShardedDescription, rank_info
from snapshotkit.errors import UnsupportedValueError


def info(shards: dict[str, ShardedDescription], *, replicated: int = 16, path: str = "/ckpt") -> RankInfo:
    state = StateBuilder().tensor("model/w", (replicated,)).build()
    base = rank_info(state, path, ("model/*",), "id")
    return dataclasses.replace(base, shards=shards)


def test_equal_parts_are_kept_once_with_the_ranks_that_sent_them() -> None:
    infos = [info({}), info({}, replicated=8), info({}), info({}, path="/other")]
    gathered = Gathered.of_infos(infos)
    assert gathered.world_size == 4
    assert len(gathered.replicated_parts) == 3  # in the order of their first rank
    assert gathered.replicated_of.tolist() == [0, 1, 0, 2]
    assert [r.tolist() for r in gathered.replicated_ranks] == [[0, 2], [1], [3]]
    assert len(gathered.sharded_parts) == 1
    assert gathered.path == "/ckpt"


def by_boxes(grid: Grid, itemsize: int, members: list[int]) -> list[RankInfo]:
    """Every rank's description box by box, as a rank without the grid would send it."""
    infos = []
    for global_rank in members:
        position = grid.position(global_rank)
        assert position is not None
        boxes = tuple(column_split(grid_box(grid, position), grid.shape, itemsize))
        infos.append(info({"dt": ShardedDescription("float32", grid.shape, boxes)}))
    return infos


@st.composite
def meshes(draw: st.DrawFn) -> tuple[Grid, list[int]]:
    """A grid over a group's members (global ranks ``offset``.. in mesh order, shuffled in the group)."""
    shape = (draw(st.integers(1, 9)), draw(st.sampled_from([1, 3, 1 << 18, 1 << 22])))  # wide: boxes split into columns
    mesh_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    dims = tuple(draw(st.sampled_from([REPLICATE, 0, 1])) for _ in mesh_shape)
    count = 1
    for n in mesh_shape:
        count *= n
    offset = draw(st.integers(0, 3))
    members = draw(st.permutations(range(offset, offset + count)))
    return Grid(mesh_shape, tuple(range(offset, offset + count)), dims, shape), list(members)


@settings(max_examples=100, deadline=None, database=None)
@given(mesh=meshes())
def test_a_grid_describes_the_boxes_it_gives(mesh: tuple[Grid, list[int]]) -> None:
    grid, members = mesh
    explicit = Gathered.of_infos(by_boxes(grid, 4, members), members)
    same = info({"dt": ShardedDescription("float32", grid.shape, (), grid)})
    gridded = Gathered.of_infos([same] * len(members), members)
    assert len(gridded.sharded_parts) == 1  # every rank sent the same part
    assert box_tables(gridded) == box_tables(explicit)
    assert decide(gridded, chunk_bytes=64) == decide(explicit, chunk_bytes=64)


def test_tensors_described_alike_share_one_table() -> None:
    grid = Grid((4,), (0, 1, 2, 3), (0,), (8, 2))
    description = ShardedDescription("float32", grid.shape, (), grid)
    tables = box_tables(Gathered.of_infos([info({"a": description, "b": description})] * 4))
    assert tables["a"] is tables["b"]
    assert tables["a"].boxes == tuple(Box((2 * r, 0), (2, 2)) for r in range(4))
    assert [tables["a"].holders(i) for i in range(4)] == [(0,), (1,), (2,), (3,)]


def test_a_rank_outside_the_mesh_is_a_bug_reported_as_such() -> None:
    grid = Grid((2,), (0, 1), (0,), (4,))
    description = ShardedDescription("float32", grid.shape, (), grid)
    with pytest.raises(UnsupportedValueError, match=r"rank 1 describes .* not in"):
        box_tables(Gathered.of_infos([info({"dt": description})] * 2, member_ranks=[0, 5]))


def test_missing_boxes_are_refused_unless_partial() -> None:
    grid = Grid((2,), (0, 1), (0,), (4,))
    description = ShardedDescription("float32", grid.shape, (), grid)
    gathered = Gathered.of_infos([info({"dt": description})])  # rank 1 of the mesh is not in the group
    with pytest.raises(UnsupportedValueError, match="cover 2 of its 4 elements"):
        box_tables(gathered)
    assert box_tables(gathered, partial=True)["dt"].boxes == (Box((0,), (2,)),)
