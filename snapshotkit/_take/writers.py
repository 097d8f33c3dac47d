"""Writers: where staged data objects go to be checksummed and written.

The take engine (:mod:`snapshotkit._take.engine`) stages each planned data object with its
writer and submits it; the writer returns a :class:`WriteJob` whose future gives the final
:class:`~snapshotkit._format.pieces.Piece` of every slot: checksummed and hashed, written, or a
reference to a base snapshot's piece (every writer runs :func:`~snapshotkit._take.reuse.decide`
before it writes and :meth:`~snapshotkit._take.reuse.Layout.finish` while it writes). Three
writers implement the one small :class:`Writer` protocol:

* :class:`InlineWriter` (``Snapshot.take``): zero-copy staging (views of the tensors' own
  memory), writes on snapshotkit's I/O loop while the caller waits;
* :class:`ThreadWriter` (``async_take(executor="thread")``): copies into pooled buffers (pinned
  once they stage a GPU piece), writes on a background loop whose threads run at low priority;
* :class:`~snapshotkit._take.process_writer.ProcessWriter` (``executor="process"``): copies into
  pooled shared memory (pinned the same way) and hands the objects to a checkpoint daemon process.

Both background writers copy GPU pieces on a side stream per device, after the caller's queued
kernels, and wait for the copies before a buffer leaves staging (:mod:`snapshotkit._take.gpu_copy`).

To add a writer: implement :class:`Writer` and return it from
:func:`snapshotkit._take.executors.background_writer`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from snapshotkit._format.pieces import Piece
from snapshotkit._format.serialization import byte_view
from snapshotkit._plan.layout import DataObjectPlan
from snapshotkit._plan.leaves import Payload
from snapshotkit._runtime.loop import background_loop, gather_or_cancel, get_loop, spawn, to_thread
from snapshotkit._runtime.staging import BufferPool, staging_budget
from snapshotkit._take.gpu_copy import GpuCopies, cuda_devices, host_buffer
from snapshotkit._take.reuse import Layout, ReuseIndex, decide
from snapshotkit._take.stage import StagedObject, ViewStager, stage_into, staging_cost_bytes
from snapshotkit.storage import StoragePlugin, open_storage_plugin


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a take writes: the snapshot's URI and storage options, and for an incremental take
    the pieces it may reference instead of writing."""

    path: str
    storage_options: Mapping[str, Any]
    reuse: ReuseIndex | None = None


def plugin_key(path: str, storage_options: Mapping[str, Any]) -> tuple[str, str]:
    """Writers keep one plugin instance per (path, options) while snapshots to it are pending."""
    return path, repr(sorted(storage_options.items()))


class WriteJob(Protocol):
    """A submitted data object: ``future`` gives its final pieces, in slot order."""

    @property
    def future(self) -> Any: ...

    def cancel(self) -> None:
        """Stop the write if it can be stopped, and wait until it no longer touches storage."""
        ...


class Writer(Protocol):
    """What the take engine needs of a writer."""

    #: ``"inline"``, ``"thread"`` or ``"process"``.
    name: str
    #: Whether staged objects wait until staging is done (or must wait for the budget) before
    #: they are submitted, so writes do not compete with staging for CPU and memory bandwidth.
    defers_writes: bool

    @property
    def pool(self) -> BufferPool | None:
        """The pool the writer stages into (its free buffers are charged to the process's
        staging budget), or None when staging allocates nothing it keeps."""
        ...

    def staging_cost(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
        """Host bytes staging ``plan`` holds until its write finished (what is allocated: for a
        pooled writer, the size of the buffer it stages into)."""
        ...

    def stage(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> StagedObject:
        """The bytes of ``plan``; from then on the caller may change the payloads' tensors
        unless the writer writes from their memory (the inline writer)."""
        ...

    def give_back(self, staged: StagedObject) -> None:
        """Return the staging buffer of a written (or abandoned) object, before its reservation
        is given back to the staging budget."""
        ...

    def io_slots(self, count: int) -> Any:
        """A limit of ``count`` writes in flight, for one take."""
        ...

    def submit(self, target: Target, staged: StagedObject, io_slots: Any) -> WriteJob:
        """Decide what ``staged`` reuses, then write the rest while it is checksummed and hashed, in the
        background (:func:`~snapshotkit._take.reuse.decide`, :meth:`~snapshotkit._take.reuse.Layout.finish`)."""
        ...

    def release(self, target: Target) -> None:
        """The take to ``target`` is over: close what the writer kept open for it."""
        ...


class _LoopWriter:
    """Writes staged objects with storage plugins on an event loop (one plugin per target)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._plugins: dict[tuple[str, str], StoragePlugin] = {}

    def _plugin_for(self, target: Target) -> StoragePlugin:
        key = plugin_key(target.path, target.storage_options)
        with self._lock:
            plugin = self._plugins.get(key)
            if plugin is None:
                plugin = self._plugins[key] = open_storage_plugin(target.path, dict(target.storage_options))
            return plugin

    def io_slots(self, count: int) -> Any:
        async def make() -> asyncio.Semaphore:
            return asyncio.Semaphore(count)  # bound to the loop it is made on

        return asyncio.run_coroutine_threadsafe(make(), self.loop).result()

    def submit(self, target: Target, staged: StagedObject, io_slots: Any) -> WriteJob:
        plugin = self._plugin_for(target)

        async def write() -> tuple[Piece, ...]:
            async with io_slots:
                layout: Layout = await to_thread(decide, staged.plan.location, staged.pieces, target.reuse)
                finishing = to_thread(layout.finish)  # checksums and hashes beside the write
                if not layout.buffers:
                    pieces: tuple[Piece, ...] = await finishing
                    return pieces
                pieces, _ = await gather_or_cancel([finishing, plugin.write(staged.plan.location, layout.buffers)])
            return pieces

        return spawn(write(), self.loop)

    def release(self, target: Target) -> None:
        with self._lock:
            plugin = self._plugins.pop(plugin_key(target.path, target.storage_options), None)
        if plugin is not None:
            asyncio.run_coroutine_threadsafe(plugin.close(), self.loop).result()


class InlineWriter(_LoopWriter):
    """The writer of a synchronous take: no staging copy for contiguous CPU tensors.

    Created per take (it remembers that take's payloads to resolve each tensor once).
    """

    name = "inline"
    defers_writes = False
    pool: BufferPool | None = None

    def __init__(self) -> None:
        super().__init__(get_loop())
        self._stager: ViewStager | None = None
        self._payloads: Sequence[Payload] | None = None

    def staging_cost(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
        return staging_cost_bytes(plan, payloads)

    def stage(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> StagedObject:
        if self._stager is None or self._payloads is not payloads:
            self._stager, self._payloads = ViewStager(payloads), payloads
        return self._stager.stage(plan)

    def give_back(self, staged: StagedObject) -> None:
        return None  # views and one-off copies: nothing pooled

    def release(self, target: Target) -> None:
        super().release(target)
        self._stager = self._payloads = None


def bucket_bytes(nbytes: int) -> int:
    """Pooled buffer sizes come in powers of two (at least 1 MiB) so buffers get reused; a
    staged object is charged its bucket's size, what is really allocated."""
    return max(1 << 20, 1 << max(0, nbytes - 1).bit_length())


class ThreadWriter(_LoopWriter):
    """Copies into pooled host buffers (pinned once they stage a GPU piece); writes on a low-priority loop."""

    name = "thread"
    defers_writes = True

    def __init__(self, niceness: int) -> None:
        super().__init__(background_loop(niceness))
        self._buffers = BufferPool(staging_budget())
        self._gpu = GpuCopies()

    @property
    def pool(self) -> BufferPool:
        return self._buffers

    def staging_cost(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> int:
        return bucket_bytes(plan.nbytes)

    def stage(self, plan: DataObjectPlan, payloads: Sequence[Payload]) -> StagedObject:
        size = bucket_bytes(plan.nbytes)
        raw = self._buffers.get(size)
        if raw is None:
            raw = host_buffer(size)
            self._buffers.add(raw)
        try:
            if cuda_devices(plan, payloads):
                self._gpu.pin_tensor(raw)  # so GPU pieces copy asynchronously
            return stage_into(plan, payloads, byte_view(raw)[: plan.nbytes], raw, self._gpu)
        except BaseException:
            self._buffers.put(size, raw)
            raise

    def give_back(self, staged: StagedObject) -> None:
        self._buffers.put(bucket_bytes(staged.plan.nbytes), staged.handle)

    def preallocate(self, sizes: Mapping[int, int], *, pinned: bool = False) -> int:
        """Pool free buffers of ``sizes`` (bucket size -> count), pages faulted in (and pinned,
        with ``pinned``); the bytes made."""

        def make(size: int) -> torch.Tensor:
            # Writing every page now faults it in: a first staging copy would otherwise pay for it.
            buffer = host_buffer(size).zero_()
            if pinned:
                self._gpu.pin_tensor(buffer)
            return buffer

        return self._buffers.preallocate(sizes, make)
