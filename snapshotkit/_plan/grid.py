"""A ``DTensor``'s sharding as a rule: mesh, placements and global shape give every rank's box.

A rank describing a sharded tensor by its own boxes sends something different from every other
rank (each fully sharded tensor has a box per rank), so at 16,384 ranks every rank would receive
16,384 different descriptions. A :class:`Grid` is the same on every rank of the mesh, and
:func:`grid_boxes` computes every rank's box from it, exactly as
``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` does for ``Shard`` and
``Replicate`` placements (``tests/plan/test_grid.py`` checks the two agree). Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from snapshotkit._format.sharded import Box, column_split

#: A mesh dimension that replicates (``Replicate()``) rather than shards.
REPLICATE = -1


@dataclasses.dataclass(frozen=True)
class Grid:
    """How a tensor of global ``shape`` is split over a device mesh.

    Attributes:
        mesh_shape: the mesh's shape.
        mesh_ranks: the global rank at each mesh position, row-major (``DeviceMesh.mesh``).
        shard_dims: per mesh dimension, the tensor dimension it shards (``Shard(d)``), or
            :data:`REPLICATE`.
        shape: the tensor's global shape.
    """

    mesh_shape: tuple[int, ...]
    mesh_ranks: tuple[int, ...]
    shard_dims: tuple[int, ...]
    shape: tuple[int, ...]
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hashed once: a take hashes each sharded leaf's grid (a mesh of thousands of ranks) in
        # its structure digest. Integers hash alike in every process.
        object.__setattr__(self, "_hash", hash((self.mesh_shape, self.mesh_ranks, self.shard_dims, self.shape)))

    def __hash__(self) -> int:
        return self._hash

    def position(self, global_rank: int) -> int | None:
        """The mesh position (row-major index) of ``global_rank``, or None if it is not in the mesh."""
        try:
            return self.mesh_ranks.index(global_rank)
        except ValueError:
            return None


@dataclasses.dataclass(frozen=True)
class GridBoxes:
    """The box of every mesh position, as arrays (row ``p`` is position ``p``).

    Attributes:
        offsets: int64, one row per position, one column per tensor dimension.
        sizes: the same shape as ``offsets``.
    """

    offsets: np.ndarray[Any, Any]
    sizes: np.ndarray[Any, Any]


def grid_boxes(grid: Grid, positions: np.ndarray[Any, Any] | None = None) -> GridBoxes:
    """The box held at each of ``positions`` (default: every mesh position), vectorized.

    Follows torch's ``Shard.local_shard_size_and_offset`` (``torch.chunk``'s split: chunks of
    ``ceil(n / k)``, the last ones short or empty) mesh dimension by mesh dimension, left to
    right, so several mesh dimensions sharding one tensor dimension nest as in torch; an empty
    shard lies at offset ``shape[d]``, as torch puts it.
    """
    count = math.prod(grid.mesh_shape)
    where = np.arange(count, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    coordinates = np.unravel_index(where, grid.mesh_shape) if grid.mesh_shape else ()
    ndim = len(grid.shape)
    offsets = np.zeros((len(where), ndim), dtype=np.int64)
    sizes = np.tile(np.asarray(grid.shape, dtype=np.int64), (len(where), 1))
    for mesh_dim, dim in enumerate(grid.shard_dims):
        if dim == REPLICATE:
            continue
        chunks = grid.mesh_shape[mesh_dim]
        coordinate = np.asarray(coordinates[mesh_dim], dtype=np.int64)
        length = sizes[:, dim]
        full = (length + chunks - 1) // chunks  # equals length // chunks when it divides evenly
        start = full * coordinate
        size = np.maximum(0, np.minimum(length, start + full) - start)
        offsets[:, dim] = np.where(size == 0, grid.shape[dim], offsets[:, dim] + np.minimum(length, start))
        sizes[:, dim] = size
    return GridBoxes(offsets, sizes)


def grid_box(grid: Grid, position: int) -> Box:
    """The box held at mesh ``position`` (see :func:`grid_boxes`)."""
    boxes = grid_boxes(grid, np.asarray([position]))
    return Box(tuple(int(v) for v in boxes.offsets[0]), tuple(int(v) for v in boxes.sizes[0]))


def is_dtensor(value: object) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(value, DTensor)


def dtensor_grid(value: Any) -> Grid | None:
    """The :class:`Grid` of a ``DTensor`` whose placements are all ``Shard``/``Replicate``, else None
    (``_StridedShard``, ``Partial``: described by their boxes instead)."""
    from torch.distributed.tensor import Replicate, Shard

    shape = tuple(int(n) for n in value.shape)
    dims: list[int] = []
    for placement in value.placements:
        if type(placement) is Shard:
            dims.append(placement.dim % len(shape) if shape else placement.dim)
        elif type(placement) is Replicate:
            dims.append(REPLICATE)
        else:
            return None
    mesh_shape, ranks = _mesh_ranks(value.device_mesh)
    return Grid(mesh_shape, ranks, tuple(dims), shape)


def checked_grid(value: Any, boxes: Sequence[Box], itemsize: int) -> Grid | None:
    """:func:`dtensor_grid` of ``value``, if it gives this rank exactly ``boxes`` (its local box,
    split by :func:`~snapshotkit._format.sharded.column_split` as a take stores it), else None."""
    grid = dtensor_grid(value)
    if grid is None:
        return None
    coordinate = value.device_mesh.get_coordinate()
    if coordinate is None:
        return None
    position = int(np.ravel_multi_index(tuple(coordinate), grid.mesh_shape)) if grid.mesh_shape else 0
    if column_split(grid_box(grid, position), grid.shape, itemsize) != list(boxes):
        return None
    return grid


_meshes: dict[int, tuple[Any, tuple[int, ...], tuple[int, ...]]] = {}


def _mesh_ranks(mesh: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A mesh's shape and global ranks, read once per mesh (every parameter shares its mesh)."""
    known = _meshes.get(id(mesh))
    if known is None or known[0] is not mesh:  # the id of a mesh since freed may be reused
        if len(_meshes) >= 16:  # a job has a few meshes; never keep many alive
            _meshes.clear()
        tensor = mesh.mesh
        known = _meshes[id(mesh)] = (mesh, tuple(int(n) for n in tensor.shape), tuple(tensor.flatten().tolist()))
    return known[1], known[2]
