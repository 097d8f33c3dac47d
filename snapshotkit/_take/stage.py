"""The write pipeline: stage each data object's pieces, checksum them, write, under the budget.

Staging is free for payloads whose memory can be written as it is (contiguous CPU tensors,
already-serialized objects); other tensors (non-contiguous views, GPU tensors, lazy conj/neg
views) are copied piece by piece into host buffers, and those copies are what the memory
budget limits.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

import torch

from snapshotkit._format.checksum import crc32c
from snapshotkit._format.serialization import byte_view, contiguous_cpu_copy, copy_flat_range_out, is_zero_copy_source
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import to_thread
from snapshotkit.storage import StoragePlugin

_PADDING = bytes(64)


@dataclasses.dataclass(slots=True)
class Payload:
    """The bytes of one stored value: a raw tensor's elements or serialized ``data``."""

    nbytes: int
    itemsize: int = 1
    tensor: torch.Tensor | None = None
    data: bytes | None = None

    @property
    def zero_copy(self) -> bool:
        return self.data is not None or (self.tensor is not None and is_zero_copy_source(self.tensor))

    @classmethod
    def of_tensor(cls, tensor: torch.Tensor) -> Payload:
        itemsize = tensor.element_size()
        return cls(tensor.numel() * itemsize, itemsize, tensor)

    @classmethod
    def of_bytes(cls, data: bytes) -> Payload:
        # The whole blob is one "element": torch.save bytes are never split into several pieces.
        return cls(len(data), max(1, len(data)), data=data)


def staging_cost_bytes(plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
    """Host bytes that staging ``plan`` allocates (zero when every piece is written in place)."""
    return sum(slot.nbytes for slot in plan.slots if not payloads[slot.payload].zero_copy)


class _Stager:
    """Turns slots into byte views, copying only where the source cannot be written directly."""

    def __init__(self, payloads: Sequence[Payload]) -> None:
        self._payloads = payloads
        self._views: dict[int, memoryview] = {}
        self._resolved: dict[int, torch.Tensor] = {}

    def view(self, slot: PieceSlot, keepalive: list[Any]) -> memoryview:
        payload = self._payloads[slot.payload]
        if payload.data is not None:
            return memoryview(payload.data)[slot.start : slot.end]
        tensor = payload.tensor
        assert tensor is not None
        if payload.zero_copy:
            whole = self._views.get(slot.payload)
            if whole is None:
                whole = self._views[slot.payload] = byte_view(tensor)
            return whole[slot.start : slot.end]
        source = self._resolved.get(slot.payload)
        if source is None:
            source = tensor.detach()
            if source.is_conj() or source.is_neg():
                source = contiguous_cpu_copy(source)
            self._resolved[slot.payload] = source
        first, last = slot.start // payload.itemsize, slot.end // payload.itemsize
        staged = torch.empty(last - first, dtype=source.dtype, device="cpu")
        copy_flat_range_out(source, first, last, staged)
        keepalive.append(staged)
        return byte_view(staged)


def _stage_object(plan: DataObjectPlan, stager: _Stager, verify: bool) -> tuple[list[memoryview], list[int], list[Any]]:
    buffers: list[memoryview] = []
    checksums: list[int] = []
    keepalive: list[Any] = []
    offset = 0
    for slot in plan.slots:
        if slot.offset > offset:
            buffers.append(memoryview(_PADDING)[: slot.offset - offset])
        view = stager.view(slot, keepalive)
        buffers.append(view)
        checksums.append(crc32c(view) if verify else 0)
        offset = slot.offset + slot.nbytes
    return buffers, checksums, keepalive


async def gather_or_cancel(awaitables: Iterable[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that cancels the rest (and waits for them) when one fails."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def write_data_objects(
    plugin: StoragePlugin,
    plans: Sequence[DataObjectPlan],
    payloads: Sequence[Payload],
    *,
    budget: MemoryBudget,
    io_concurrency: int,
    written: list[str],
) -> dict[tuple[int, int], int]:
    """Write every data object; return the CRC-32C of each piece keyed by ``(payload, start)``.

    ``written`` collects the locations whose write started, so a failed take can delete them.
    """
    stager = _Stager(payloads)
    slots_in_flight = asyncio.Semaphore(io_concurrency)
    checksums: dict[tuple[int, int], int] = {}

    async def write_one(plan: DataObjectPlan) -> None:
        cost = staging_cost_bytes(plan, payloads)
        async with slots_in_flight, budget.reserve(cost):
            buffers, crcs, keepalive = await to_thread(_stage_object, plan, stager, True)
            written.append(plan.location)
            await plugin.write(plan.location, buffers)
            del keepalive
        for slot, crc in zip(plan.slots, crcs, strict=False):
            checksums[(slot.payload, slot.start)] = crc

    await gather_or_cancel(write_one(plan) for plan in plans)
    return checksums
