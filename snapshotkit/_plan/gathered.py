"""Every rank's description as the first take's exchange delivers it: each distinct part once.

A rank's :class:`~snapshotkit._plan.leaves.RankInfo` is sent as two *parts*, its replicated
candidates (with its path and patterns) and its sharded tensors, plus its byte count. Ranks of
one job mostly send equal parts (the same replicated leaves; sharded tensors described by their
:class:`~snapshotkit._plan.grid.Grid`), so :class:`Gathered` keeps each distinct part once and,
per rank, which part it sent: planning then works per distinct part, not per rank
(:mod:`snapshotkit._plan.decide`). :func:`box_table` turns a sharded tensor's parts into its
distinct boxes and their holders, vectorized. Pure: no process group.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from snapshotkit._format import sharded
from snapshotkit._format.serialization import dtype_from_name
from snapshotkit._format.sharded import Box, column_split
from snapshotkit._plan.grid import Grid, grid_boxes
from snapshotkit._plan.leaves import LeafSignature, RankInfo, ShardedDescription
from snapshotkit.errors import UnsupportedValueError

Array = np.ndarray[Any, Any]


@dataclasses.dataclass(frozen=True)
class ReplicatedPart:
    """The replicated side of a rank's description: its path, patterns and candidates."""

    path: str
    patterns: tuple[str, ...]
    candidates: Mapping[str, LeafSignature]


@dataclasses.dataclass(frozen=True)
class RankParts:
    """One rank's :class:`~snapshotkit._plan.leaves.RankInfo`, split as the exchange sends it."""

    total_bytes: int
    replicated: ReplicatedPart
    sharded: Mapping[str, ShardedDescription]

    @classmethod
    def of(cls, info: RankInfo) -> RankParts:
        return cls(info.total_bytes, ReplicatedPart(info.path, info.patterns, info.candidates), info.shards)


def encode_part(part: object) -> bytes:
    """A part's bytes on the wire (its digest is :func:`part_digest` of them)."""
    return pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)


def part_digest(data: bytes) -> bytes:
    """16 bytes naming a part's contents: equal parts, equal digests (collisions: 2**-128)."""
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclasses.dataclass(frozen=True)
class Gathered:
    """Every rank's description, each distinct part once, in the order of the first rank sending it.

    Attributes:
        total_bytes: int64 per rank, its :attr:`~snapshotkit._plan.leaves.RankInfo.total_bytes`.
        replicated_parts: the distinct replicated parts (rank 0's first).
        replicated_of: per rank, the index of its replicated part.
        sharded_parts: the distinct sharded parts.
        sharded_of: per rank, the index of its sharded part.
        member_ranks: per rank of the group, its global rank (a grid names global ranks).
    """

    total_bytes: Array
    replicated_parts: tuple[ReplicatedPart, ...]
    replicated_of: Array
    sharded_parts: tuple[Mapping[str, ShardedDescription], ...]
    sharded_of: Array
    member_ranks: Array

    @property
    def world_size(self) -> int:
        return len(self.total_bytes)

    @property
    def path(self) -> str:
        """Rank 0's path, which every rank writes to."""
        return self.replicated_parts[int(self.replicated_of[0])].path

    @classmethod
    def of_infos(cls, infos: Sequence[RankInfo], member_ranks: Sequence[int] | None = None) -> Gathered:
        """The view of ``infos`` (one per rank), parts told apart as the exchange tells them."""
        return cls.of_parts([RankParts.of(info) for info in infos], member_ranks)

    @classmethod
    def of_parts(cls, parts: Sequence[RankParts], member_ranks: Sequence[int] | None = None) -> Gathered:
        replicated: dict[bytes, int] = {}
        sharded: dict[bytes, int] = {}
        replicated_parts: list[ReplicatedPart] = []
        sharded_parts: list[Mapping[str, ShardedDescription]] = []
        replicated_of, sharded_of = [], []
        alone = len(parts) == 1  # one rank (a take without a process group): nothing to tell apart
        for rank_parts in parts:
            key = b"" if alone else part_digest(encode_part(rank_parts.replicated))
            if (index := replicated.get(key)) is None:
                index = replicated[key] = len(replicated_parts)
                replicated_parts.append(rank_parts.replicated)
            replicated_of.append(index)
            key = b"" if alone else part_digest(encode_part(rank_parts.sharded))
            if (index := sharded.get(key)) is None:
                index = sharded[key] = len(sharded_parts)
                sharded_parts.append(rank_parts.sharded)
            sharded_of.append(index)
        members = range(len(parts)) if member_ranks is None else member_ranks
        return cls(
            np.asarray([p.total_bytes for p in parts], dtype=np.int64),
            tuple(replicated_parts),
            np.asarray(replicated_of, dtype=np.int64),
            tuple(sharded_parts),
            np.asarray(sharded_of, dtype=np.int64),
            np.asarray(members, dtype=np.int64),
        )

    @functools.cached_property
    def replicated_ranks(self) -> list[Array]:
        """Per distinct replicated part, the ranks (ascending) that sent it."""
        return _ranks_by_part(self.replicated_of, len(self.replicated_parts))

    @functools.cached_property
    def sharded_ranks(self) -> list[Array]:
        """Per distinct sharded part, the ranks (ascending) that sent it."""
        return _ranks_by_part(self.sharded_of, len(self.sharded_parts))


def _ranks_by_part(of: Array, count: int) -> list[Array]:
    order = np.argsort(of, kind="stable")
    bounds = np.searchsorted(of[order], np.arange(count + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(count)]


@dataclasses.dataclass(frozen=True, eq=False)
class BoxTable:
    """A sharded tensor's distinct boxes, in first-seen order (by rank, then each rank's order),
    and the ranks holding each (ascending).

    Attributes:
        dtype: the global tensor's dtype (with ``shape``).
        offsets: int64, one row per distinct box.
        sizes: the same shape as ``offsets``.
        holder_start: box ``i`` is held by ``holder_ranks[holder_start[i]:holder_start[i + 1]]``.
        holder_ranks: int64.
    """

    dtype: str
    shape: tuple[int, ...]
    offsets: Array
    sizes: Array
    holder_start: Array
    holder_ranks: Array

    def __len__(self) -> int:
        return len(self.offsets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoxTable) and equal_fields(self, other)

    def holders(self, index: int) -> tuple[int, ...]:
        return tuple(self.holder_ranks[self.holder_start[index] : self.holder_start[index + 1]].tolist())

    @functools.cached_property
    def offset_tuples(self) -> list[tuple[int, ...]]:
        return list(map(tuple, self.offsets.tolist()))

    @functools.cached_property
    def size_tuples(self) -> list[tuple[int, ...]]:
        return list(map(tuple, self.sizes.tolist()))

    @functools.cached_property
    def boxes(self) -> tuple[Box, ...]:
        return tuple(map(Box, self.offset_tuples, self.size_tuples))

    @functools.cached_property
    def index(self) -> dict[tuple[int, ...], int]:
        """Box offsets -> index (offsets name a distinct box: the boxes do not overlap)."""
        return {offsets: i for i, offsets in enumerate(self.offset_tuples)}


def box_tables(gathered: Gathered, *, partial: bool = False) -> dict[str, BoxTable]:
    """Each sharded tensor's :class:`BoxTable`, in first-seen order; tensors described alike by
    the same ranks share one table (computed once).

    ``partial``: the ranks hold part of each tensor only (a DCP rank's own chunks); no coverage check.

    Raises:
        UnsupportedValueError: the ranks' shards of a tensor disagree on its global dtype or
            shape, or their distinct boxes do not cover it exactly once (by element count).
    """
    described: dict[str, list[tuple[int, ShardedDescription]]] = {}
    seen: dict[str, ShardedDescription] = {}
    for index, part in enumerate(gathered.sharded_parts):  # in the order of their first rank
        first_rank = int(gathered.sharded_ranks[index][0])
        for path, description in part.items():
            if (known := seen.get(path)) is None:
                known = seen[path] = description
            if known.dtype != description.dtype or known.shape != description.shape:
                raise UnsupportedValueError(
                    f"the sharded tensor at {path!r} is {known.dtype} {list(known.shape)} on one rank and "
                    f"{description.dtype} {list(description.shape)} on rank {first_rank}; every rank must hold "
                    "shards of the same global tensor"
                )
            described.setdefault(path, []).append((index, description))
    tables: dict[str, BoxTable] = {}
    made: dict[tuple[object, ...], BoxTable] = {}
    for path, parts in described.items():
        first = seen[path]
        key = (first.dtype, first.shape, *((i, d.grid if d.grid is not None else d.boxes) for i, d in parts))
        if (table := made.get(key)) is None:
            table = made[key] = _table(gathered, path, first, parts, partial)
        tables[path] = table
    return tables


def _table(
    gathered: Gathered, path: str, first: ShardedDescription, parts: list[tuple[int, ShardedDescription]], partial: bool
) -> BoxTable:
    ndim = len(first.shape)
    itemsize = dtype_from_name(first.dtype).itemsize
    ranks, offsets, sizes = [], [], []
    for index, description in parts:
        holders = gathered.sharded_ranks[index]
        if description.grid is not None:
            r, o, s = _grid_rows(description.grid, gathered.member_ranks[holders], holders, itemsize, path)
        else:
            boxes = description.boxes
            r = np.repeat(holders, len(boxes))
            o = np.tile(
                np.asarray([b.offsets for b in boxes], dtype=np.int64).reshape(len(boxes), ndim), (len(holders), 1)
            )
            s = np.tile(
                np.asarray([b.sizes for b in boxes], dtype=np.int64).reshape(len(boxes), ndim), (len(holders), 1)
            )
        ranks.append(r)
        offsets.append(o)
        sizes.append(s)
    all_ranks = np.concatenate(ranks)
    order = np.argsort(all_ranks, kind="stable")  # by rank, then each rank's own order
    all_ranks = all_ranks[order]
    rows = np.concatenate([np.concatenate(offsets), np.concatenate(sizes)], axis=1)[order]
    if len(rows) == 0:
        distinct, first_seen, inverse = rows, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    elif ndim == 0:  # every box of a 0-d tensor is the same (empty) box
        distinct, first_seen, inverse = rows[:1], np.zeros(1, dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
    else:
        distinct, first_seen, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    by_first = np.argsort(first_seen, kind="stable")
    renumber = np.empty(len(by_first), dtype=np.int64)
    renumber[by_first] = np.arange(len(by_first))
    box_of_row = renumber[inverse]
    distinct = distinct[by_first]
    grouped = np.argsort(box_of_row, kind="stable")
    holder_start = np.concatenate([[0], np.cumsum(np.bincount(box_of_row, minlength=len(distinct)))]).astype(np.int64)
    table = BoxTable(first.dtype, first.shape, distinct[:, :ndim], distinct[:, ndim:], holder_start, all_ranks[grouped])
    covered = int(np.prod(table.sizes, axis=1).sum()) if len(table) else 0
    total = math.prod(first.shape)
    if covered != total and not (partial and covered < total):
        raise UnsupportedValueError(
            f"the shards of {path!r} held by the ranks cover {covered} of its {total} elements "
            "(overlapping or missing shards); every shard must be held by a rank of the process group"
        )
    return table


def _rows(values: list[tuple[int, ...]], ndim: int) -> Array:
    return np.asarray(values, dtype=np.int64).reshape(len(values), ndim)


def _grid_rows(grid: Grid, global_ranks: Array, ranks: Array, itemsize: int, path: str) -> tuple[Array, Array, Array]:
    """The boxes the grid gives ``ranks`` (of global ranks ``global_ranks``), split as a take
    stores them: one row per (rank, box)."""
    positions = _positions(grid)
    known = global_ranks < len(positions)
    where = np.where(known, positions[np.minimum(global_ranks, len(positions) - 1)], -1)
    if (missing := np.nonzero(where < 0)[0]).size:
        raise UnsupportedValueError(
            f"rank {int(ranks[missing[0]])} describes the sharded tensor at {path!r} by a device mesh it is not in; "
            "this is a bug in snapshotkit, please report it"
        )
    boxes = grid_boxes(grid, where)
    return _split_rows(grid.shape, itemsize, ranks, boxes.offsets, boxes.sizes)


def _split_rows(
    shape: tuple[int, ...], itemsize: int, ranks: Array, offsets: Array, sizes: Array
) -> tuple[Array, Array, Array]:
    """Each row's box replaced by its :func:`~snapshotkit._format.sharded.column_split` sub-boxes,
    rank by rank, in order: one row per (rank, stored box), as the take of each rank stores them."""
    ndim = len(shape)
    if ndim < 2 or not len(sizes):
        return ranks, offsets, sizes
    # A split box holds at least two parts of the smaller minimum: most boxes (many ranks, small
    # shards) are ruled out here, vectorized, without a call per box.
    least = 2 * min(sharded.COLUMN_SPLIT_MIN_BYTES, sharded.FULL_WIDTH_SPLIT_MIN_BYTES)
    if not (np.prod(sizes, axis=1) * itemsize >= least).any():
        return ranks, offsets, sizes
    # column_split depends on a box's sizes only (its offsets shift the parts): split each
    # distinct size once, at offset 0, then shift the parts to every box of that size.
    distinct, inverse = np.unique(sizes, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    splits = [column_split(Box((0,) * ndim, tuple(int(v) for v in row)), shape, itemsize) for row in distinct]
    if all(len(parts) == 1 for parts in splits):
        return ranks, offsets, sizes
    part_offsets = np.asarray([p.offsets for parts in splits for p in parts], dtype=np.int64).reshape(-1, ndim)
    part_sizes = np.asarray([p.sizes for parts in splits for p in parts], dtype=np.int64).reshape(-1, ndim)
    per_distinct = np.asarray([len(parts) for parts in splits], dtype=np.int64)
    first_part = np.concatenate([[0], np.cumsum(per_distinct)[:-1]]).astype(np.int64)
    counts = per_distinct[inverse]
    row = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    within = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    part = first_part[inverse][row] + within
    return ranks[row], offsets[row] + part_offsets[part], part_sizes[part]


def _positions(grid: Grid) -> Array:
    """Global rank -> mesh position (-1: not in the mesh)."""
    ranks = np.asarray(grid.mesh_ranks, dtype=np.int64)
    positions = np.full(int(ranks.max()) + 1 if ranks.size else 0, -1, dtype=np.int64)
    positions[ranks] = np.arange(len(ranks))
    return positions


def equal_fields(a: object, b: object) -> bool:
    """Field by field, arrays by value (for the dataclasses holding arrays)."""
    for field in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, field.name), getattr(b, field.name)
        if not (np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y):
            return False
    return True
