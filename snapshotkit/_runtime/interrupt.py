"""Waits on the main thread that a Ctrl-C always ends.

CPython can lose a SIGINT that arrives just as the main thread starts blocking on a lock: the
signal handler's flag is set between the interpreter's last check and the blocking call, so the
wait is not interrupted and the ``KeyboardInterrupt`` is raised only when the wait ends by itself
(for a stalled write: never; a second Ctrl-C gets through). The waits here block the main thread
for at most :data:`SLICE_S` at a time, so a pending interrupt is raised within that slice. On other
threads (which signals never reach) they are the plain waits.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: The longest the main thread blocks at once in :func:`wait_interruptibly`.
SLICE_S = 0.2


def wait_interruptibly(wait: Callable[[float | None], bool], timeout: float | None = None) -> bool:
    """``wait(timeout)``, a call like :meth:`threading.Event.wait` that returns whether it is done,
    in slices of at most :data:`SLICE_S` on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return wait(0)
        if wait(SLICE_S if left is None else min(SLICE_S, left)):
            return True


def future_result(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)``, waiting by :func:`wait_interruptibly`."""
    if not future.done():

        def settled(seconds: float | None) -> bool:
            return not concurrent.futures.wait([future], seconds).not_done

        if not wait_interruptibly(settled, timeout):
            raise TimeoutError(f"the result was not ready within {timeout} s")
    return future.result()
