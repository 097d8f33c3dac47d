"""Preemption notices: a signal handler that records SIGTERM (and others) for the manager to act on.

Cluster schedulers (Kubernetes, SLURM with ``--signal``, spot instances) announce a preemption
with a signal some seconds before the kill. The handler only records it; the training loop sees
it through ``SnapshotManager.should_save`` and saves at the next step boundary, never inside
the handler (a snapshot taken from a signal handler could catch a half-updated model).

IMPORTANT: a previous Python handler keeps running (it is chained). The default action of
SIGTERM (terminate at once) is *not* run while the watcher is open: the point is to survive the
signal long enough to save. Once closed, the watcher puts the previous handler back if its own is
still installed; if another handler was installed over it meanwhile (a second manager), its
handler stays reachable from that one and passes every signal on to the previous handler, the
default action included, so closing managers in any order never leaves a signal swallowed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

_log = logging.getLogger("snapshotkit.manager")

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class PreemptionWatcher:
    """Records the signals in ``signals`` once installed (a no-op off the main thread).

    Attributes:
        received: set once one of the signals arrived (or :meth:`request` was called).
    """

    def __init__(self, signals: Sequence[int]) -> None:
        self.received = threading.Event()
        self._previous: dict[int, Handler] = {}
        self._closed = False
        if not signals:
            return
        if threading.current_thread() is not threading.main_thread():
            _log.info(
                "preemption signals are not watched: the manager was created off the main thread, where Python "
                "cannot install signal handlers; call request_preemption() from your own handler instead"
            )
            return
        for number in dict.fromkeys(signals):
            self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._dispatch(signum, frame, surviving=False)

    def _dispatch(self, signum: int, frame: FrameType | None, *, surviving: bool) -> None:
        """Record the signal if open, then pass it down the chain of previous handlers. Once an
        open watcher saw it (``surviving``), the default action at the end of the chain is not run."""
        if not self._closed:
            self.received.set()
            _log.info("received %s: the next should_save() is true so the loop saves", signal.Signals(signum).name)
            surviving = True
        previous = self._previous.get(signum)
        owner = getattr(previous, "__self__", None)
        if isinstance(owner, PreemptionWatcher):
            owner._dispatch(signum, frame, surviving=surviving)
        elif callable(previous):
            previous(signum, frame)
        elif not surviving and previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)  # as if never installed: the default action
            os.kill(os.getpid(), signum)

    def request(self) -> None:
        """Record a preemption notice without a signal (for schedulers that announce it otherwise)."""
        self.received.set()

    def close(self) -> None:
        """Stop recording; put the previous handlers back where ours are still installed. Idempotent."""
        self._closed = True
        if threading.current_thread() is not threading.main_thread():
            return
        for number, previous in self._previous.items():
            if signal.getsignal(number) == self._handle:
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)
