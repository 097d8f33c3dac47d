"""The host-memory budget: how many staging/bounce bytes may be held at once.

One budget object serves both sides of the pipeline: a take stages on the caller's thread and
frees on the I/O loop (:meth:`MemoryBudget.take` / :meth:`MemoryBudget.give`), a restore reserves
and frees on the I/O loop (``await acquire`` / ``await release`` / ``async with reserve``).

A reservation waits until it fits in what is left. One that is larger than the whole budget
waits until nothing else is reserved and then runs alone, so an oversized item slows the
pipeline down instead of failing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator


class MemoryBudget:
    """A byte semaphore with the run-alone rule, safe across threads and event loops.

    Attributes:
        total_bytes: the budget.
        reserved_bytes: bytes reserved now.
        peak_reserved_bytes: the most ever reserved at once (for tests and benchmarks).
    """

    def __init__(self, total_bytes: int) -> None:
        if total_bytes <= 0:
            raise ValueError(f"memory budget must be positive, got {total_bytes}")
        self.total_bytes = total_bytes
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self._holders = 0
        self._changed = threading.Condition()
        # Coroutines waiting for room, woken on their own loop when bytes are given back.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def _fits(self, nbytes: int) -> bool:
        return self._holders == 0 or self.reserved_bytes + nbytes <= self.total_bytes

    def _take_locked(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self._holders += 1
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def fits(self, nbytes: int) -> bool:
        """Whether reserving ``nbytes`` now would not wait."""
        with self._changed:
            return nbytes <= 0 or self._fits(nbytes)

    def take(self, nbytes: int) -> None:
        """Reserve ``nbytes``, blocking the calling thread until they fit (never on an event loop)."""
        if nbytes <= 0:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._fits(nbytes))
            self._take_locked(nbytes)

    def give(self, nbytes: int) -> None:
        """Return a reservation (from any thread or loop; never blocks)."""
        if nbytes <= 0:
            return
        with self._changed:
            self.reserved_bytes -= nbytes
            self._holders -= 1
            self._changed.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile has no one to wake
                loop.call_soon_threadsafe(_wake, waiter)

    async def acquire(self, nbytes: int) -> None:
        """Reserve ``nbytes`` from a coroutine; zero-byte reservations never wait."""
        if nbytes <= 0:
            return
        loop = asyncio.get_running_loop()
        while True:
            with self._changed:
                if self._fits(nbytes):
                    self._take_locked(nbytes)
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
            await waiter

    async def release(self, nbytes: int) -> None:
        """Return a reservation made with :meth:`acquire`."""
        self.give(nbytes)

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int) -> AsyncIterator[None]:
        """``async with budget.reserve(n):`` hold ``n`` bytes for the block."""
        await self.acquire(nbytes)
        try:
            yield
        finally:
            self.give(nbytes)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
