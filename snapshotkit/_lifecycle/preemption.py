"""Preemption notices: a signal handler that records SIGTERM (and others) for the manager to act on.

Cluster schedulers (Kubernetes, SLURM with ``--signal``, spot instances) announce a preemption
with a signal some seconds before the kill. The handler only records it; the training loop sees
it through ``SnapshotManager.should_save`` and saves at the next step boundary, never inside
the handler (a snapshot taken from a signal handler could catch a half-updated model).

IMPORTANT: a previous Python handler keeps running (it is chained). The default action of
SIGTERM (terminate at once) is *not* run: the point is to survive the signal long enough to
save. The manager's ``close()`` puts the previous handlers back.
"""

from __future__ import annotations

import logging
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
        received: set once one of the signals arrived.
        signum: the last signal received (None before).
    """

    def __init__(self, signals: Sequence[int]) -> None:
        self.received = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, Handler] = {}
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
        self.signum = signum
        self.received.set()
        _log.info("received %s: the next should_save() is true so the loop saves", signal.Signals(signum).name)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def request(self) -> None:
        """Record a preemption notice without a signal (for schedulers that announce it otherwise)."""
        self.received.set()

    def close(self) -> None:
        """Put the previous handlers back where ours are still installed; idempotent."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number, previous in self._previous.items():
            if signal.getsignal(number) == self._handle:
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
