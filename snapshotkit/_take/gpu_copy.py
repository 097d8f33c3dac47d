"""Copying GPU pieces to host staging buffers without racing the work that produced them.

A background writer copies each GPU piece on a side CUDA stream so the copies overlap. CUDA
orders work only within a stream, so the copies follow three rules (docs/architecture.md,
"GPU staging"):

1. **Producer first.** Before the first copy of a staged object, the side stream of each device
   it reads waits for that device's *current* stream on the caller's thread (where the model's
   kernels, ``optimizer.step()`` among them, were queued): a copy never reads a tensor that
   queued kernels are still writing.
2. **One side stream per device.** A copy of a tensor on device ``d`` runs on the current stream
   of ``d``: the side stream must belong to ``d`` (not to whichever device was current when the
   writer first staged), or the copy would run on the caller's stream and the wait in rule 3
   would not cover it.
3. **Done before the buffer moves.** Staging records an event on each side stream it used and
   waits for it before it returns (or raises): a pooled buffer never reaches the writer, the
   daemon or another take while a copy into it is in flight, and the caller may change its
   tensors once staging returned. ``Tensor.record_stream`` also tells the caching allocator that
   the side stream read each source tensor.

Host staging buffers are pinned (registered with the CUDA driver) only once a staged object with
a CUDA piece uses them: a state on the CPU never pins memory. A buffer whose registration fails
stays pageable: its copies are then synchronous, still ordered and correct.
"""

from __future__ import annotations

import logging
import mmap
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from snapshotkit._plan.layout import DataObjectPlan
from snapshotkit._plan.leaves import Payload

logger = logging.getLogger("snapshotkit")

#: ``cudaHostRegisterPortable``: the memory counts as pinned in every CUDA context of the process.
_REGISTER_PORTABLE = 1


def cuda_device_indices(devices: Iterable[torch.device]) -> tuple[int, ...]:
    """The CUDA device indices among ``devices``, sorted, each once (an index-less ``cuda``
    device is the current one)."""
    found: set[int] = set()
    for device in devices:
        if device.type == "cuda":
            found.add(device.index if device.index is not None else torch.cuda.current_device())
    return tuple(sorted(found))


def cuda_devices(plan: DataObjectPlan, payloads: Sequence[Payload]) -> tuple[int, ...]:
    """The CUDA devices whose tensors staging ``plan`` reads (empty for a CPU-only object)."""
    # is_cuda first: it is cheap, and a take of many small CPU tensors asks once per data object.
    tensors = [t for t in (payloads[slot.payload].tensor for slot in plan.slots) if t is not None and t.is_cuda]
    return cuda_device_indices(tensor.device for tensor in tensors) if tensors else ()


def host_buffer(nbytes: int) -> torch.Tensor:
    """A new uint8 CPU tensor of ``nbytes`` in pages of its own (an anonymous mapping), so it can
    be pinned and unpinned without touching memory that other allocations share a page with."""
    if hasattr(mmap, "MAP_PRIVATE"):
        # Private, as malloc's memory is: a process forked later (a data loader worker) does not share it.
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # pragma: no cover - Windows
        mapping = mmap.mmap(-1, nbytes)
    return torch.frombuffer(mapping, dtype=torch.uint8)


class GpuCopies:
    """A writer's side streams (one per device, made on first use of that device) and the host
    buffers it pinned. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}
        #: address -> bytes of every buffer registered by :meth:`pin` and not yet unpinned.
        self._pinned: dict[int, int] = {}
        self._failed: set[int] = set()

    def stream(self, device: int) -> Any:
        """The side stream of ``device``."""
        with self._lock:
            side = self._streams.get(device)
            if side is None:
                side = self._streams[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            return side

    @property
    def pinned_bytes(self) -> int:
        """The bytes of host memory this writer registered and has not unregistered."""
        with self._lock:
            return sum(self._pinned.values())

    def pin(self, address: int, nbytes: int) -> bool:
        """Register ``nbytes`` at ``address`` as pinned (once); whether it is.

        The caller unpins it with :meth:`unpin` before the memory is freed or unmapped.
        """
        with self._lock:
            if address in self._pinned:
                return True
            if address in self._failed or nbytes == 0:
                return False
            code = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, _REGISTER_PORTABLE))  # type: ignore[no-untyped-call]
            if code != 0:
                self._failed.add(address)
                logger.warning(
                    "could not pin a %d-byte staging buffer (cudaHostRegister error %d): GPU tensors are "
                    "copied into it synchronously, still correct but slower",
                    nbytes,
                    code,
                )
                return False
            self._pinned[address] = nbytes
            return True

    def pin_tensor(self, buffer: torch.Tensor) -> bool:
        """:meth:`pin` a :func:`host_buffer` (once); it is unpinned when the tensor is freed."""
        address = buffer.data_ptr()
        with self._lock:
            if address in self._pinned:
                return True
        if not self.pin(address, buffer.numel()):
            return False
        # Not at interpreter exit: the mapping goes with the process, and CUDA may be shutting down.
        weakref.finalize(buffer, self.unpin, address).atexit = False
        return True

    def unpin(self, address: int) -> None:
        """Unregister a buffer :meth:`pin` registered (nothing if it did not)."""
        with self._lock:
            self._failed.discard(address)
            if self._pinned.pop(address, None) is None:
                return
            code = int(torch.cuda.cudart().cudaHostUnregister(address))  # type: ignore[no-untyped-call]
        if code != 0:
            logger.warning("could not unpin a staging buffer (cudaHostUnregister error %d)", code)

    @contextmanager
    def ordered(self, devices: Sequence[int]) -> Iterator[dict[int, Any]]:
        """The side streams of ``devices``, each after its device's current stream (rule 1);
        on exit, however it is left, every copy queued on them has finished (rule 3)."""
        streams: dict[int, Any] = {}
        try:
            for device in devices:
                side = streams[device] = self.stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
            yield streams
        finally:
            for side in streams.values():
                side.record_event().synchronize()
