"""Sharded tensors (``DTensor``, ``ShardedTensor``, :class:`LocalChunks`) as boxes of a global tensor.

A take stores each distinct local box once; a restore fills each destination box from the
stored boxes it overlaps, reading only the stored pieces (whole dim-0 row blocks) that overlap.
A box of at least a few MiB is stored as a few column sub-boxes (:func:`column_split`): a box
narrower than the tensor along a dim other than 0 (``Shard(1)``) along that dim, a full-width
box (``Shard(0)``, FSDP) along dim 1, so a reader wanting part of its columns reads whole,
verified pieces of the sub-boxes it overlaps instead of whole rows of the box.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from snapshotkit.errors import UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class Box:
    """The elements ``[offsets[d], offsets[d] + sizes[d])`` along every dim ``d`` of a global tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclasses.dataclass
class LocalShards:
    """What this rank holds of a sharded tensor: the global shape and its local boxes."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    boxes: list[tuple[Box, torch.Tensor]]
    layout: str


@dataclasses.dataclass(frozen=True)
class LocalChunks:
    """Chunks of a global tensor that this process holds, without a tensor subclass around them.

    A take stores it as a sharded leaf (its chunks as boxes) and a restore fills its chunks as it
    fills a ``DTensor``'s local shard: how DCP's write items (chunks with offsets) and read items
    (regions of a stored tensor) go through the one take and restore pipeline.

    Attributes:
        dtype: the global tensor's dtype (every chunk's).
        shape: the global tensor's shape.
        chunks: each box with the local tensor of exactly its sizes.
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    chunks: tuple[tuple[Box, torch.Tensor], ...]


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def _sharded_tensor_class() -> Any:
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - removed from torch
        return None
    return ShardedTensor


def is_sharded(value: object) -> bool:
    """Whether ``value`` is a ``DTensor``, a ``ShardedTensor`` or :class:`LocalChunks`."""
    if type(value) is LocalChunks:
        return True
    if not isinstance(value, torch.Tensor) or type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        return False  # the common case, without importing torch.distributed.tensor (about 1 s)
    dtensor, sharded = _dtensor_class(), _sharded_tensor_class()
    return (dtensor is not None and isinstance(value, dtensor)) or (sharded is not None and isinstance(value, sharded))


def local_shards(value: torch.Tensor | LocalChunks, logical_path: str) -> LocalShards:
    """The boxes ``value`` holds on this rank, each with its local tensor (a view, no copy)."""
    if isinstance(value, LocalChunks):
        return LocalShards(value.dtype, value.shape, list(value.chunks), "DCP chunks")
    dtensor = _dtensor_class()
    if dtensor is not None and isinstance(value, dtensor):
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        if any(isinstance(p, Partial) for p in value.placements):
            raise UnsupportedValueError(
                f"the DTensor at {logical_path!r} has a Partial placement (pending reduction); "
                "redistribute it to Shard/Replicate placements before taking a snapshot"
            )
        shape = tuple(value.shape)
        local_shape, offsets = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        local = value.to_local()
        if tuple(local.shape) != tuple(local_shape):
            raise UnsupportedValueError(
                f"the DTensor at {logical_path!r} has a local tensor of shape {list(local.shape)}, but its "
                f"placements give {list(local_shape)}; snapshotkit stores only evenly described shards"
            )
        layout = f"DTensor mesh={list(value.device_mesh.shape)} placements={[str(p) for p in value.placements]}"
        return LocalShards(value.dtype, shape, [(Box(tuple(offsets), tuple(local_shape)), local)], layout)
    shards = []
    for shard in value.local_shards():  # type: ignore[attr-defined]
        metadata = shard.metadata
        box = Box(tuple(metadata.shard_offsets), tuple(metadata.shard_sizes))
        shards.append((box, shard.tensor))
    return LocalShards(value.dtype, tuple(value.size()), shards, "ShardedTensor")


def destination_boxes(value: object) -> list[tuple[Box, torch.Tensor]] | None:
    """The boxes a restore destination wants filled, each with the local tensor to fill in place.

    A ``DTensor``, ``ShardedTensor`` or :class:`LocalChunks` wants its local boxes; None for anything else.
    """
    if not is_sharded(value):
        return None
    assert isinstance(value, (torch.Tensor, LocalChunks))
    return local_shards(value, "<destination>").boxes


def overlap(a: Box, b: Box) -> Box | None:
    """The intersection of two boxes, or None if they do not overlap (or it is empty)."""
    offsets, sizes = [], []
    for ao, an, bo, bn in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True):
        low, high = max(ao, bo), min(ao + an, bo + bn)
        if high <= low:
            return None
        offsets.append(low)
        sizes.append(high - low)
    return Box(tuple(offsets), tuple(sizes))


#: A stored sub-box of a split narrow box holds at least this many bytes (smaller boxes are not
#: split, so a manifest of many small shards does not grow).
COLUMN_SPLIT_MIN_BYTES = 1 << 20
#: A stored sub-box of a split full-width box (``Shard(0)``, FSDP) holds at least this many bytes,
#: the default piece size: each sub-box is then still one or more whole pieces, so a take writes
#: about as many pieces as before, and the small boxes of many-rank FSDP are never split.
FULL_WIDTH_SPLIT_MIN_BYTES = 16 << 20
#: At most this many sub-boxes per box: a reader then reads at most two sub-boxes it needs only
#: part of, 2/8 of a box, and typically far less (a few extra requests, merged when adjacent).
#: IMPORTANT: every rank of a take must split alike (replicated boxes are matched by their
#: offsets and sizes); 1 stores every box whole, as before this split existed (benchmarks only).
COLUMN_SPLIT_MAX_PARTS = 8


def column_split(box: Box, shape: Sequence[int], itemsize: int) -> list[Box]:
    """The sub-boxes a take stores for ``box`` of a tensor of global ``shape``: ``[box]`` itself,
    or up to :data:`COLUMN_SPLIT_MAX_PARTS` contiguous slices of ``box`` along one dim ``d``:

    * when ``box`` is narrower than ``shape`` along a dim ``> 0`` (``Shard(1)``), ``d`` is the
      first such dim, and each slice holds at least :data:`COLUMN_SPLIT_MIN_BYTES`;
    * otherwise (a full-width box, ``Shard(0)``, of at least 2 dims), ``d`` is 1 and each slice
      holds at least :data:`FULL_WIDTH_SPLIT_MIN_BYTES`.

    The sub-boxes are disjoint, cover ``box``, are in order along ``d``, and depend only on the
    sizes of ``box``, ``shape`` and ``itemsize`` (every rank holding a box splits it alike; the
    offsets of ``box`` only shift them).
    """
    dim = next((d for d in range(1, len(box.sizes)) if box.sizes[d] < shape[d]), None)
    min_bytes = COLUMN_SPLIT_MIN_BYTES
    if dim is None:
        if len(box.sizes) < 2:
            return [box]
        dim, min_bytes = 1, FULL_WIDTH_SPLIT_MIN_BYTES
    width = box.sizes[dim]
    column_bytes = math.prod(box.sizes) // width * itemsize if width else 0  # one slice along dim
    # the most parts whose narrowest (width // parts slices) still holds the minimum
    parts = min(COLUMN_SPLIT_MAX_PARTS, width)
    while parts > 1 and column_bytes * (width // parts) < min_bytes:
        parts -= 1
    if parts <= 1:
        return [box]
    boxes: list[Box] = []
    for part in range(parts):
        start, end = width * part // parts, width * (part + 1) // parts
        offsets = (*box.offsets[:dim], box.offsets[dim] + start, *box.offsets[dim + 1 :])
        sizes = (*box.sizes[:dim], end - start, *box.sizes[dim + 1 :])
        boxes.append(Box(offsets, sizes))
    return boxes


def piece_boxes(shard_box: Box, piece_sizes: Sequence[int], itemsize: int) -> list[Box]:
    """The box of each stored piece of a shard (pieces are whole dim-0 row blocks, in order)."""
    offsets, sizes = shard_box.offsets, shard_box.sizes
    if not sizes:  # a 0-d tensor: one piece, the whole (empty) box
        return [shard_box] * len(piece_sizes)
    row_bytes = itemsize * math.prod(sizes[1:])
    boxes: list[Box] = []
    row = 0
    for nbytes in piece_sizes:
        rows = nbytes // row_bytes if row_bytes else 0
        boxes.append(Box((offsets[0] + row, *offsets[1:]), (rows, *sizes[1:])))
        row += rows
    return boxes


def box_slice(tensor: torch.Tensor, origin: Sequence[int], box: Box) -> torch.Tensor:
    """The view of ``tensor`` (whose element 0 sits at global ``origin``) covering ``box``."""
    view = tensor
    for dim, (offset, size) in enumerate(zip(box.offsets, box.sizes, strict=True)):
        view = view.narrow(dim, offset - origin[dim], size)
    return view
