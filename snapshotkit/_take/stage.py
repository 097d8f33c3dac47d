"""Staging: turn a planned data object into the exact bytes to write, and checksum them.

Two ways, one layout (the pieces at their offsets, zero padding between):

* :class:`ViewStager`, for the inline writer: views of the payloads' own memory wherever it can
  be written as it is (contiguous CPU tensors, serialized objects: no copy at all); other
  tensors (non-contiguous views, GPU tensors, lazy conj/neg views) are copied piece by piece into
  host buffers, and those copies are what the memory budget counts (:func:`staging_cost_bytes`).
* :func:`stage_into`, for the background writers: every piece copied into one buffer the writer
  owns (pooled, pinned or shared memory), so the caller may change its tensors as soon as
  staging returns. GPU pieces are copied on a side CUDA stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from snapshotkit._format.serialization import (
    byte_view,
    contiguous_cpu_copy,
    copy_flat_range_out,
    flat_range_views,
    tensor_from_bytes,
)
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.leaves import Payload

_PADDING = bytes(64)


@dataclasses.dataclass(frozen=True)
class StagedObject:
    """A data object ready to write.

    Attributes:
        plan: what it holds.
        buffers: its bytes, back to back (pieces and padding).
        pieces: each slot's bytes, in slot order (what the checksums cover).
        handle: the writer's buffer to take back once written (None for views).
        keepalive: staging copies that must live until the write finished.
    """

    plan: DataObjectPlan
    buffers: tuple[memoryview, ...]
    pieces: tuple[memoryview, ...]
    handle: Any = None
    keepalive: tuple[Any, ...] = ()


def staging_cost_bytes(plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
    """Host bytes :class:`ViewStager` allocates for ``plan`` (zero when every piece is written in place)."""
    return sum(slot.nbytes for slot in plan.slots if not payloads[slot.payload].zero_copy)


class ViewStager:
    """Stages data objects as views of the payloads' memory (see the module docstring).

    Resolved sources (a conj/neg view materialised once) are kept per payload, so a tensor
    split into many pieces is resolved once, not once per piece.
    """

    def __init__(self, payloads: Sequence[Payload]) -> None:
        self._payloads = payloads
        self._resolved: dict[int, torch.Tensor] = {}

    def _source(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        source = self._resolved.get(index)
        if source is None:
            source = tensor.detach()
            if source.is_conj() or source.is_neg():
                source = contiguous_cpu_copy(source)
            self._resolved[index] = source
        return source

    def _view(self, slot: PieceSlot, keepalive: list[Any]) -> memoryview:
        payload = self._payloads[slot.payload]
        if payload.data is not None:
            return memoryview(payload.data)[slot.start : slot.end]
        assert payload.tensor is not None
        if payload.zero_copy:
            return byte_view(payload.tensor)[slot.start : slot.end]
        first, last = slot.start // payload.itemsize, slot.end // payload.itemsize
        staged = torch.empty(last - first, dtype=payload.tensor.dtype, device="cpu")
        copy_flat_range_out(self._source(slot.payload, payload.tensor), first, last, staged)
        keepalive.append(staged)
        return byte_view(staged)

    def stage(self, plan: DataObjectPlan) -> StagedObject:
        """``plan`` as views of the payloads' memory, copying only what cannot be written in place."""
        buffers: list[memoryview] = []
        pieces: list[memoryview] = []
        keepalive: list[Any] = []
        offset = 0
        for slot in plan.slots:
            if slot.offset > offset:
                buffers.append(memoryview(_PADDING)[: slot.offset - offset])
            view = self._view(slot, keepalive)
            buffers.append(view)
            pieces.append(view)
            offset = slot.offset + slot.nbytes
        return StagedObject(plan, tuple(buffers), tuple(pieces), None, tuple(keepalive))


def stage_into(
    plan: DataObjectPlan, payloads: Sequence[Payload], out: memoryview, handle: Any, stream: Any = None
) -> StagedObject:
    """Copy the pieces of ``plan`` into ``out`` (``plan.nbytes`` long) at their offsets.

    GPU pieces are copied on ``stream`` (a side CUDA stream) without blocking and waited for at
    the end, so the copies overlap each other; ``out`` should then be pinned host memory.
    """
    position = 0
    pending_gpu = False
    for slot in plan.slots:
        if slot.offset > position:
            out[position : slot.offset] = bytes(slot.offset - position)  # alignment padding
        destination = out[slot.offset : slot.offset + slot.nbytes]
        payload = payloads[slot.payload]
        if payload.data is not None:
            destination[:] = memoryview(payload.data)[slot.start : slot.end]
        else:
            assert payload.tensor is not None
            source = payload.tensor.detach()
            if source.is_conj() or source.is_neg():
                source = source.resolve_conj().resolve_neg()
            first, last = slot.start // payload.itemsize, slot.end // payload.itemsize
            target = tensor_from_bytes(destination, source.dtype, (last - first,))
            gpu = source.is_cuda and stream is not None
            pending_gpu = pending_gpu or gpu
            with torch.cuda.stream(stream) if gpu else contextlib.nullcontext():
                position_in_target = 0
                for view in flat_range_views(source, first, last):
                    count = view.numel()
                    target[position_in_target : position_in_target + count].view(view.shape).copy_(
                        view, non_blocking=gpu
                    )
                    position_in_target += count
        position = slot.offset + slot.nbytes
    if pending_gpu:
        stream.synchronize()
    pieces = tuple(out[s.offset : s.offset + s.nbytes] for s in plan.slots)
    return StagedObject(plan, (out,), pieces, handle)
