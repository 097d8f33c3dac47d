"""The event loop snapshotkit owns.

Storage I/O is ``async``; the synchronous API runs coroutines on one long-lived loop in a
daemon thread, so it works the same whether or not the caller already runs a loop (Jupyter).
Blocking work (file I/O, checksums, copies) goes to that loop's default thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

from snapshotkit._runtime.interrupt import future_result

T = TypeVar("T")

#: Threads for blocking I/O and GIL-releasing CPU work (checksums, memcpy).
_EXECUTOR_THREADS = 8

#: How long an interrupted call waits for the cancelled coroutine to clean up.
_CANCEL_CLEANUP_TIMEOUT_S = 60.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_background_loops: dict[int, asyncio.AbstractEventLoop] = {}


def lower_thread_priority(niceness: int) -> None:
    """Give the calling thread the scheduling niceness ``niceness`` (0 = unchanged, 19 = lowest).

    On Linux niceness is per thread, and threads inherit their creator's; elsewhere this changes
    the whole process, so it is only done on Linux. A niceness can only be raised without
    privileges; a failure leaves the thread as it was.
    """
    if niceness <= 0 or sys.platform != "linux":
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if niceness > current:
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError:  # pragma: no cover - e.g. a seccomp profile that forbids it
        pass


def _start_loop(name: str = "snapshotkit-loop", niceness: int = 0) -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(
            max_workers=_EXECUTOR_THREADS,
            thread_name_prefix=f"{name}-io",
            initializer=lower_thread_priority,
            initargs=(niceness,),
        )
    )
    ready = threading.Event()

    def run() -> None:
        lower_thread_priority(niceness)
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        while True:
            try:
                loop.run_forever()
                return
            except BaseException:  # noqa: S112
                # KeyboardInterrupt/SystemExit raised by code running on the loop escape
                # run_forever() after being set on their task; keep serving, or every later
                # call (and the caller waiting on that task) would hang.
                continue

    threading.Thread(target=run, name=name, daemon=True).start()
    ready.wait()
    return loop


def background_loop(niceness: int) -> asyncio.AbstractEventLoop:
    """A second loop for background writes (``async_take``), its threads at ``niceness``.

    Kept apart from :func:`get_loop` because a thread's niceness cannot be lowered again: the
    loop that serves the caller's own takes and restores keeps normal priority.
    """
    with _lock:
        loop = _background_loops.get(niceness)
        if loop is None or loop.is_closed():
            loop = _background_loops[niceness] = _start_loop(f"snapshotkit-background-{niceness}", niceness)
        return loop


def _forget_loop_after_fork() -> None:
    """A forked child has the parent's loop objects but not their threads: start afresh on first use."""
    global _loop, _lock
    _loop = None
    _background_loops.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_after_fork)


def get_loop() -> asyncio.AbstractEventLoop:
    """The snapshotkit loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = _start_loop()
        return _loop


class Spawned(Generic[T]):
    """A coroutine running on a snapshotkit loop, awaited from another thread.

    Attributes:
        future: completes with the coroutine's result or exception.
    """

    def __init__(self, coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> None:
        self._finished = threading.Event()
        self._abandoned = threading.Event()
        self.future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            _tracked(coro, self._finished, self._abandoned), loop
        )

    def result(self, timeout: float | None = None) -> T:
        return future_result(self.future, timeout)

    @property
    def settled(self) -> bool:
        """Whether the coroutine itself finished (its clean-up included): after a :meth:`cancel`
        that outlasted its bounded wait, it may still be running, and its effects still to come."""
        return self._finished.is_set()

    def cancel(self) -> None:
        """Cancel the coroutine and wait (bounded) until its own clean-up has run."""
        if not self.future.done():
            # Cancelling the concurrent future cancels the task; it completes at once while the
            # task may still be cleaning up, so wait for the coroutine itself to finish.
            self._abandoned.set()
            self.future.cancel()
            self._finished.wait(timeout=_CANCEL_CLEANUP_TIMEOUT_S)


async def _tracked(coro: Coroutine[Any, Any, T], finished: threading.Event, abandoned: threading.Event) -> T:
    # Not a closure over the Spawned: a failure's traceback holds this frame, and the frame its
    # function, so a closure would make a reference cycle (error -> frame -> Spawned -> future
    # -> error) that keeps everything the failed coroutine touched alive until a collection.
    try:
        return await coro
    except Exception:
        if abandoned.is_set():
            # Cancelled by a caller that stopped listening, but it failed before the cancellation
            # reached it: nobody can retrieve this error any more (asyncio would log it as "never
            # retrieved" when the task is collected); the caller already has the failure it acts on.
            raise asyncio.CancelledError from None
        raise
    finally:
        finished.set()  # set only after the coroutine's own clean-up ran


def spawn(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> Spawned[T]:
    """Start ``coro`` on ``loop`` (default: the snapshotkit loop) without waiting for it."""
    if threading.current_thread().name == "snapshotkit-loop":
        raise RuntimeError("spawn() called from the snapshotkit loop itself; await the coroutine instead")
    return Spawned(coro, loop or get_loop())


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the snapshotkit loop and wait for its result.

    If the waiting thread is interrupted (``KeyboardInterrupt``), the coroutine is cancelled and
    given the chance to clean up (a take deletes what it wrote) before the interrupt propagates.
    """
    spawned = spawn(coro)
    try:
        return spawned.result()
    except BaseException:
        spawned.cancel()
        raise


async def to_thread(func: Any, *args: Any) -> Any:
    """Run a blocking callable on the snapshotkit thread pool.

    If the awaiting task is cancelled, this still waits for the thread to finish before the
    cancellation propagates: a thread cannot be stopped, and clean-up that runs while it is
    still writing (a failed take deleting its data objects) would be undone by it.
    """
    future = asyncio.get_running_loop().run_in_executor(None, func, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # shield() stops watching ``future`` once the awaiting side is cancelled: retrieve its
        # exception here (the cancellation is what propagates), or asyncio logs "Future exception
        # was never retrieved" when it is collected.
        future.add_done_callback(_retrieve_exception)
        await asyncio.wait([future])
        raise
    finally:
        # A failure's traceback holds this frame, and the future holds the failure: without
        # this, the pair is a reference cycle that keeps ``args`` (buffers) alive until a collection.
        del future


def _retrieve_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def gather_or_cancel(awaitables: Iterable[Awaitable[Any]]) -> list[Any]:
    """``asyncio.gather`` that cancels the rest (and waits for them) when one fails."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except GeneratorExit:  # closed without its loop (collected): nothing can be awaited any more
        for task in tasks:
            task.cancel()
        raise
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
