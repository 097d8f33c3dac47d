"""A Ctrl-C reaches the main thread while it waits, also when CPython would lose it.

``_thread.interrupt_main()`` schedules the SIGINT handler without sending a signal, so a thread
blocked on a lock is not woken: exactly the state CPython leaves a wait in when a real SIGINT
arrives just before the wait blocks (seen as a hang of
``tests/take/test_commit.py::test_ctrl_c_during_take_deletes_what_it_wrote_before_raising``).
"""

from __future__ import annotations

import _thread
import concurrent.futures
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from snapshotkit._runtime.interrupt import SLICE_S, future_result, wait_interruptibly
from snapshotkit._take.job import TakeJob

#: How long the watchdog lets the main thread miss the interrupt before it ends the wait itself.
GRACE_S = 5.0


@pytest.fixture
def sigint_handler() -> Iterator[None]:
    # A process started in the background by a non-interactive shell ignores SIGINT.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_then_release(
    waiting: Callable[[], bool], release: Callable[[], None], missed: list[str]
) -> threading.Thread:
    """Once ``waiting()``, schedule a KeyboardInterrupt on the main thread; if it is still waiting
    after GRACE_S, note that and end the wait with ``release``."""
    delivered = threading.Event()
    poll = threading.Event()

    def run() -> None:
        give_up = time.monotonic() + GRACE_S
        while not waiting() and time.monotonic() < give_up:
            poll.wait(0.01)
        _thread.interrupt_main()
        if not delivered.wait(GRACE_S):
            missed.append("the main thread kept waiting after the interrupt")
            release()

    def on_sigint(signum: int, frame: object) -> None:
        delivered.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.usefixtures("sigint_handler")
def test_waiting_on_a_future_is_interrupted() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    missed: list[str] = []

    def waiting() -> bool:
        # A thread waiting on the future is a waiter of its condition (Future.result) or
        # registered on the future (concurrent.futures.wait).
        return bool(future._waiters) or bool(future._condition._waiters)  # type: ignore[attr-defined]

    watchdog = _interrupt_then_release(waiting, lambda: future.set_result(1), missed)
    try:
        with pytest.raises(KeyboardInterrupt):
            future_result(future)
    finally:
        watchdog.join()
    assert missed == []


@pytest.mark.usefixtures("sigint_handler")
def test_waiting_on_a_take_is_interrupted() -> None:
    job = TakeJob.__new__(TakeJob)
    done = threading.Event()
    waiting = threading.Event()

    class Done:
        """The take's done flag (all wait() looks at): it never comes by itself."""

        def wait(self, timeout: float | None) -> bool:
            waiting.set()
            return done.wait(timeout)

    job._done = Done()  # type: ignore[assignment]
    missed: list[str] = []
    watchdog = _interrupt_then_release(waiting.is_set, done.set, missed)
    try:
        with pytest.raises(KeyboardInterrupt):
            job.wait()
    finally:
        watchdog.join()
    assert missed == []


def test_a_timeout_is_kept_and_a_result_returned() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(TimeoutError):
        future_result(future, timeout=SLICE_S * 1.5)
    assert not wait_interruptibly(threading.Event().wait, 0.01)
    future.set_result(7)
    assert future_result(future, timeout=0) == 7


def test_a_stored_timeout_error_is_raised_not_waited_on() -> None:
    future: concurrent.futures.Future[int] = concurrent.futures.Future()
    future.set_exception(TimeoutError("the store timed out"))
    with pytest.raises(TimeoutError, match="the store timed out"):
        future_result(future)


def test_off_the_main_thread_the_plain_wait_is_used() -> None:
    calls: list[float | None] = []

    def wait(timeout: float | None) -> bool:
        calls.append(timeout)
        return True

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(wait_interruptibly, wait, None).result()
    assert calls == [None]
    assert wait_interruptibly(wait, None)
    assert calls == [None, SLICE_S]
