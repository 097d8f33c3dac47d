"""Staging: turn a planned data object into the exact bytes to write, and checksum them.

Two ways, one layout (the pieces at their offsets, zero padding between):

* :class:`ViewStager`, for the inline writer: views of the payloads' own memory wherever it can
  be written as it is (contiguous CPU tensors, serialized objects: no copy at all); other
  tensors (non-contiguous views, GPU tensors, lazy conj/neg views) are copied piece by piece into
  host buffers, and those copies are what the memory budget counts (:func:`staging_cost_bytes`).
* :func:`stage_into`, for the background writers: every piece copied into one buffer the writer
  owns (pooled, pinned or shared memory), so the caller may change its tensors as soon as
  staging returns. GPU pieces are copied on a side CUDA stream per device, ordered after the
  caller's queued kernels (:mod:`snapshotkit._take.gpu_copy`).
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
    copyable,
    flat_range_views,
    memory_view,
    tensor_from_bytes,
)
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.leaves import Payload
from snapshotkit._take.gpu_copy import GpuCopies, cuda_devices

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
    return sum(
        slot.end - slot.start
        for slot in plan.slots
        if not (payload := payloads[slot.payload]).address and payload.data is None  # not Payload.zero_copy
    )


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

    def _copied(self, slot: PieceSlot, tensor: torch.Tensor, itemsize: int, keepalive: list[Any]) -> memoryview:
        first, last = slot.start // itemsize, slot.end // itemsize
        staged = torch.empty(last - first, dtype=tensor.dtype, device="cpu")
        copy_flat_range_out(self._source(slot.payload, tensor), first, last, staged)
        keepalive.append(staged)
        return byte_view(staged)

    def stage(self, plan: DataObjectPlan) -> StagedObject:
        """``plan`` as views of the payloads' memory, copying only what cannot be written in place."""
        buffers: list[memoryview] = []
        pieces: list[memoryview] = []
        keepalive: list[Any] = []
        payloads = self._payloads
        offset = 0
        # One pass with no per-slot method calls: a take of many small tensors has a slot per tensor.
        for slot in plan.slots:
            start, end, at = slot.start, slot.end, slot.offset
            if at > offset:
                buffers.append(memoryview(_PADDING)[: at - offset])
            payload = payloads[slot.payload]
            if payload.address:  # a tensor written from its own memory (Payload.zero_copy)
                view = memory_view(payload.address + start, end - start)
            elif payload.data is not None:
                view = memoryview(payload.data)[start:end]
            else:
                tensor = payload.tensor
                assert tensor is not None
                view = self._copied(slot, tensor, payload.itemsize, keepalive)
            buffers.append(view)
            pieces.append(view)
            offset = at + end - start
        return StagedObject(plan, tuple(buffers), tuple(pieces), None, tuple(keepalive))


def stage_into(
    plan: DataObjectPlan, payloads: Sequence[Payload], out: memoryview, handle: Any, gpu: GpuCopies | None = None
) -> StagedObject:
    """Copy the pieces of ``plan`` into ``out`` (``plan.nbytes`` long) at their offsets.

    With ``gpu``, GPU pieces are copied without blocking on the side stream of their device,
    after the work already queued on that device's current stream, and every copy has finished
    when this returns or raises (the rules of :mod:`snapshotkit._take.gpu_copy`); ``out`` should
    then be pinned. Without it they are copied on the current stream, synchronously.
    """
    ordering: contextlib.AbstractContextManager[dict[int, Any]] = (
        gpu.ordered(cuda_devices(plan, payloads)) if gpu is not None else contextlib.nullcontext({})
    )
    with ordering as streams:
        position = 0
        for slot in plan.slots:
            if slot.offset > position:
                out[position : slot.offset] = bytes(slot.offset - position)  # alignment padding
            destination = out[slot.offset : slot.offset + slot.nbytes]
            payload = payloads[slot.payload]
            if payload.data is not None:
                destination[:] = memoryview(payload.data)[slot.start : slot.end]
            else:
                assert payload.tensor is not None
                first, last = slot.start // payload.itemsize, slot.end // payload.itemsize
                target = tensor_from_bytes(destination, payload.tensor.dtype, (last - first,))
                side = streams.get(payload.tensor.device.index) if payload.tensor.is_cuda else None
                # On the side stream, even the conj/neg resolution runs after the producer's kernels.
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    _copy_range(payload.tensor, first, last, target, non_blocking=side is not None)
                    if side is not None:
                        payload.tensor.record_stream(side)  # its memory is not reused while the copy reads it
            position = slot.offset + slot.nbytes
    pieces = tuple(out[s.offset : s.offset + s.nbytes] for s in plan.slots)
    return StagedObject(plan, (out,), pieces, handle)


def _copy_range(tensor: torch.Tensor, first: int, last: int, target: torch.Tensor, *, non_blocking: bool) -> None:
    """Copy elements ``[first, last)`` (row-major) of ``tensor`` into flat host ``target``."""
    source = tensor.detach()
    if source.is_conj() or source.is_neg():
        source = source.resolve_conj().resolve_neg()
    source, target = copyable(source), copyable(target)
    position = 0
    for view in flat_range_views(source, first, last):
        count = view.numel()
        target[position : position + count].view(view.shape).copy_(view, non_blocking=non_blocking)
        position += count
