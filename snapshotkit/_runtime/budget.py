"""The host-memory budget: how many staging/bounce bytes may be held at once.

A reservation waits until it fits in what is left. One that is larger than the whole budget
waits until nothing else is reserved and then runs alone, so an oversized item slows the
pipeline down instead of failing it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class MemoryBudget:
    """An asyncio byte semaphore with the run-alone rule. Use on one event loop."""

    def __init__(self, total_bytes: int) -> None:
        if total_bytes <= 0:
            raise ValueError(f"memory budget must be positive, got {total_bytes}")
        self.total_bytes = total_bytes
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self._holders = 0
        self._changed = asyncio.Condition()

    def _fits(self, nbytes: int) -> bool:
        return self._holders == 0 or self.reserved_bytes + nbytes <= self.total_bytes

    async def acquire(self, nbytes: int) -> None:
        """Reserve ``nbytes``; zero-byte reservations never wait."""
        if nbytes <= 0:
            return
        async with self._changed:
            await self._changed.wait_for(lambda: self._fits(nbytes))
            self.reserved_bytes += nbytes
            self._holders += 1
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    async def release(self, nbytes: int) -> None:
        """Return a reservation made with :meth:`acquire`."""
        if nbytes <= 0:
            return
        async with self._changed:
            self.reserved_bytes -= nbytes
            self._holders -= 1
            self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int) -> AsyncIterator[None]:
        """``async with budget.reserve(n):`` hold ``n`` bytes for the block."""
        await self.acquire(nbytes)
        try:
            yield
        finally:
            await self.release(nbytes)
