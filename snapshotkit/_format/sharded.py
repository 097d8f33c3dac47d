"""Sharded tensors (``DTensor``, ``ShardedTensor``) as boxes of a global tensor.

A take stores each distinct local box once; a restore fills each destination box from the
stored boxes it overlaps, reading only the stored pieces (whole dim-0 row blocks) that overlap.
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
    """Whether ``value`` is a ``DTensor`` or a ``ShardedTensor``."""
    if not isinstance(value, torch.Tensor) or type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
        return False  # the common case, without importing torch.distributed.tensor (about 1 s)
    dtensor, sharded = _dtensor_class(), _sharded_tensor_class()
    return (dtensor is not None and isinstance(value, dtensor)) or (sharded is not None and isinstance(value, sharded))


def local_shards(value: torch.Tensor, logical_path: str) -> LocalShards:
    """The boxes ``value`` holds on this rank, each with its local tensor (a view, no copy)."""
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

    A ``DTensor`` or ``ShardedTensor`` wants its local boxes; None for anything else.
    """
    if not is_sharded(value):
        return None
    assert isinstance(value, torch.Tensor)
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
