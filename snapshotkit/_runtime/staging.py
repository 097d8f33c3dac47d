"""The staging memory of takes: one budget per process, shared by every take in flight.

Staging (:mod:`snapshotkit._take.engine`) reserves the bytes of each data object before it
copies it, and gives them back once the object is written. The reservation is charged to the one
:class:`StagingBudget` of the process (:func:`staging_budget`), whatever the take, the writer or
the thread: a second ``async_take`` while one is being written waits for budget the earlier
one's writes give back, so staging never holds more than ``memory_budget_bytes`` in all.

The background writers copy into pooled buffers (:class:`BufferPool`; pinned host memory, shared
memory segments) that outlive a take, so the next take pays no allocation or page faults. A
pooled buffer stays charged while it is free, and is charged its real size (power-of-two
buckets, see :func:`~snapshotkit._take.writers.bucket_bytes`): reserved bytes plus free pooled
bytes are the staging memory that exists, and they stay within the budget:

* a reservation waits only for reservations (free buffers never make it wait); when it is made,
  free buffers are freed (evicted, other sizes first) until everything fits again, unless one
  of the right size is free, which the reservation then claims;
* a buffer given back is kept only if it fits in the budget, otherwise freed;
* a reservation larger than the whole budget waits until no other is held, then runs alone
  (its buffer is freed once written), so an oversized data object slows staging down instead
  of failing or deadlocking it.

The budget's size is the ``memory_budget_bytes`` of the latest reservation (each take passes its
own; they are the same unless the caller varies them), so a smaller one shrinks the pools.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

#: Frees a buffer a pool no longer keeps (close and unlink a shared memory segment...).
Discard = Callable[[Any], None]


class StagingBudget:
    """The bytes every take of this process stages into (see the module docstring).

    Safe across threads; reservations block the calling thread (never an event loop).

    Attributes:
        total_bytes: the budget (the latest reservation's ``memory_budget_bytes``).
        reserved_bytes: bytes reserved by staging now (buffers in use, one-off copies).
        pooled_bytes: bytes of free buffers pools keep for later takes.
        peak_held_bytes: the most ever reserved and pooled at once (for tests and benchmarks;
            :meth:`reset_peak` starts over).
    """

    def __init__(self, total_bytes: int = 1) -> None:
        self.total_bytes = total_bytes
        self.reserved_bytes = 0
        self.pooled_bytes = 0
        self.peak_held_bytes = 0
        self._holders = 0
        self._waiting = 0
        self._changed = threading.Condition()
        self._pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()

    @property
    def held_bytes(self) -> int:
        """Reserved and pooled bytes: the staging memory that exists now."""
        return self.reserved_bytes + self.pooled_bytes

    def _fits(self, nbytes: int) -> bool:
        return self._holders == 0 or self.reserved_bytes + nbytes <= self.total_bytes

    def _note_peak(self) -> None:
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def _reserve_locked(self, nbytes: int, pool: BufferPool | None) -> list[tuple[BufferPool, Any]]:
        """Charge ``nbytes``; claim a free buffer of that size in ``pool`` or evict to make room.
        Returns the evicted buffers, to free once the lock is released."""
        self.reserved_bytes += nbytes
        self._holders += 1
        if pool is not None and pool._claim_locked(nbytes):
            self.pooled_bytes -= nbytes  # a free buffer becomes a reserved one: nothing new exists
        evicted = self._evict_locked(self.reserved_bytes)  # (a smaller budget than the last take's)
        self._note_peak()
        return evicted

    def _evict_locked(
        self, keep_reserved_bytes: int, spare: Mapping[int, int] | None = None
    ) -> list[tuple[BufferPool, Any]]:
        """Take free buffers out of the pools until ``keep_reserved_bytes`` and what stays pooled fit
        in the budget (or nothing evictable is left); ``spare``: bucket size -> count to keep."""
        evicted: list[tuple[BufferPool, Any]] = []
        for pool in list(self._pools):
            while keep_reserved_bytes + self.pooled_bytes > self.total_bytes:
                taken = pool._evict_one_locked(spare or {})
                if taken is None:
                    break
                size, handle = taken
                self.pooled_bytes -= size
                evicted.append((pool, handle))
        return evicted

    def resize(self, total_bytes: int) -> None:
        """Make the budget ``total_bytes`` (evicting free buffers that no longer fit)."""
        if total_bytes <= 0:
            raise ValueError(f"memory budget must be positive, got {total_bytes}")
        with self._changed:
            self.total_bytes = total_bytes
            evicted = self._evict_locked(self.reserved_bytes)
            self._changed.notify_all()
        _discard(evicted)

    def try_take(self, nbytes: int, total_bytes: int, pool: BufferPool | None = None) -> bool:
        """Reserve ``nbytes`` if that needs no waiting (see :meth:`take`); whether it did."""
        if nbytes <= 0:
            return True
        with self._changed:
            self.total_bytes = total_bytes
            if not self._fits(nbytes):
                return False
            evicted = self._reserve_locked(nbytes, pool)
        _discard(evicted)
        return True

    def take(self, nbytes: int, total_bytes: int, pool: BufferPool | None = None) -> None:
        """Reserve ``nbytes`` of a budget of ``total_bytes``, blocking until they fit.

        With ``pool``, ``nbytes`` is the size of the buffer about to be staged into: a free one of
        that size in ``pool`` is claimed for :meth:`BufferPool.get`.
        """
        if nbytes <= 0:
            return
        with self._changed:
            self.total_bytes = total_bytes
            if not self._fits(nbytes):
                self._waiting += 1
                self._changed.notify_all()  # for wait_for_waiting
                try:
                    self._changed.wait_for(lambda: self._fits(nbytes))
                finally:
                    self._waiting -= 1
            evicted = self._reserve_locked(nbytes, pool)
        _discard(evicted)

    def give(self, nbytes: int) -> None:
        """Return a reservation (from any thread; never blocks)."""
        if nbytes <= 0:
            return
        with self._changed:
            self.reserved_bytes -= nbytes
            self._holders -= 1
            self._changed.notify_all()

    def wait_for_waiting(self, count: int = 1, timeout_s: float | None = None) -> bool:
        """Block until ``count`` reservations wait for room (for tests); whether they do."""
        with self._changed:
            return self._changed.wait_for(lambda: self._waiting >= count, timeout_s)

    def reset_peak(self) -> None:
        """Start :attr:`peak_held_bytes` over from what is held now."""
        with self._changed:
            self.peak_held_bytes = self.held_bytes


class BufferPool:
    """Free staging buffers of one writer, by size, charged to ``budget`` while they are free.

    A buffer comes from :meth:`get` (a free one the budget reservation claimed) or is made by the
    writer and registered with :meth:`add`; :meth:`put` gives it back once written (before the
    engine gives back its reservation). Buffers the pool does not keep go to ``discard``.

    Attributes:
        allocated: every buffer that exists now (free or in use), in the order they were made.
    """

    def __init__(self, budget: StagingBudget, discard: Discard = lambda handle: None) -> None:
        self.budget = budget
        self._discard = discard
        self._free: dict[int, list[Any]] = {}
        self._claimed: Counter[int] = Counter()
        self.allocated: list[Any] = []
        self._closed = False
        with budget._changed:
            budget._pools.add(self)
        # A pool dropped without close() (a writer a test replaced) gives its free bytes back.
        weakref.finalize(self, _uncharge, budget, self._free, self._claimed)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of every buffer that exists now, free or in use."""
        return sum(_size_of(handle) for handle in self.allocated)

    def _claim_locked(self, size: int) -> bool:
        if len(self._free.get(size, ())) > self._claimed[size]:
            self._claimed[size] += 1
            return True
        return False

    def _evictable_bytes_locked(self, spare: Mapping[int, int]) -> int:
        return sum(
            size * max(0, len(free) - self._claimed[size] - spare.get(size, 0)) for size, free in self._free.items()
        )

    def _evict_one_locked(self, spare: Mapping[int, int]) -> tuple[int, Any] | None:
        # The largest free buffer nobody claimed and ``spare`` does not keep.
        for size in sorted(self._free, reverse=True):
            if len(self._free[size]) > self._claimed[size] + spare.get(size, 0):
                handle = self._free[size].pop(0)
                self._forget(handle)
                return size, handle
        return None

    def _forget(self, handle: Any) -> None:
        self.allocated = [h for h in self.allocated if h is not handle]

    def get(self, size: int) -> Any | None:
        """The free buffer of ``size`` the reservation claimed, or None: make one and :meth:`add` it."""
        with self.budget._changed:
            if self._claimed[size] <= 0:
                return None
            self._claimed[size] -= 1
            return self._free[size].pop()

    def add(self, handle: Any) -> None:
        """Register a buffer the writer made for a reservation (it is in use)."""
        with self.budget._changed:
            self.allocated.append(handle)

    def put(self, size: int, handle: Any) -> None:
        """A buffer is free again: keep it if it fits in the budget, else free it.

        Called while its reservation is still held (the engine gives it back next): kept, the
        buffer's bytes move from the reservation to the pool.
        """
        with self.budget._changed:
            budget = self.budget
            keep = not self._closed and budget.reserved_bytes + budget.pooled_bytes <= budget.total_bytes
            if keep:
                self._free.setdefault(size, []).append(handle)
                budget.pooled_bytes += size
            else:
                self._forget(handle)
        if not keep:
            self._discard(handle)

    def missing(self, sizes: Mapping[int, int]) -> list[int]:
        """The buffer sizes to make so that ``sizes[size]`` buffers of each size are free."""
        with self.budget._changed:
            return [
                size
                for size, count in sorted(sizes.items())
                for _ in range(count - len(self._free.get(size, ())) + self._claimed[size])
            ]

    def preallocate(self, sizes: Mapping[int, int], make: Callable[[int], Any]) -> int:
        """Make the missing buffers of ``sizes`` with ``make(size)`` and keep them free, as far as
        they fit in the budget beside what is reserved (free buffers of other sizes are evicted
        for them); the bytes made."""
        made = 0
        budget = self.budget
        for size in self.missing(sizes):
            with budget._changed:
                evictable = sum(pool._evictable_bytes_locked(sizes) for pool in budget._pools)
                fits = budget.held_bytes - evictable + size <= budget.total_bytes
                evicted = budget._evict_locked(budget.reserved_bytes + size, spare=sizes) if fits else []
                if fits:
                    budget.pooled_bytes += size  # charged before it exists, so nothing else takes the room
            _discard(evicted)
            if not fits:
                break
            try:
                handle = make(size)
            except BaseException:
                with budget._changed:
                    budget.pooled_bytes -= size
                    budget._changed.notify_all()
                raise
            with budget._changed:
                self.allocated.append(handle)
                self._free.setdefault(size, []).append(handle)
                budget._note_peak()
            made += size
        return made

    def close(self) -> list[Any]:
        """Stop pooling: uncharge the free buffers and return every buffer (to free them).
        Buffers still in use are freed when they are :meth:`put` back."""
        with self.budget._changed:
            self._closed = True
            handles, self.allocated = self.allocated, []
        _uncharge(self.budget, self._free, self._claimed)  # a claimed one was uncharged when claimed
        return handles


def _uncharge(budget: StagingBudget, free: dict[int, list[Any]], claimed: Counter[int]) -> None:
    with budget._changed:
        budget.pooled_bytes -= sum(size * (len(handles) - claimed[size]) for size, handles in free.items())
        free.clear()
        claimed.clear()
        budget._changed.notify_all()


def _size_of(handle: Any) -> int:
    numel = getattr(handle, "numel", None)
    return int(numel()) if callable(numel) else int(handle.size)


def _discard(evicted: list[tuple[BufferPool, Any]]) -> None:
    for pool, handle in evicted:
        pool._discard(handle)


_budget = StagingBudget()


def staging_budget() -> StagingBudget:
    """The process's staging budget (shared by every take, writer and thread)."""
    return _budget
