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

With many ranks, a notice one rank received must make every rank save at the same step:
:class:`NoticeAgreement` has the ranks agree on it every ``check_every`` calls of ``should_save``,
through the process group's store (no collective, no device sync), and not at all in between.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from snapshotkit._dist import Group

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


class NoticeAgreement:
    """Whether a preemption notice arrived, as every rank of a manager agrees on it.

    Every rank calls :meth:`poll` once per ``should_save``, so the calls are counted alike on
    every rank: calls ``0, check_every, 2 * check_every...`` (counting from 0) are rounds of
    :meth:`Group.any_through_store`, the others communicate nothing. A notice is therefore acted
    on at most ``check_every`` calls after it arrived, at the same call on every rank. Once agreed,
    it stays agreed and no more rounds run (every rank stops at the same call). On one rank the
    watcher is read at every call.

    Args:
        group: the manager's group.
        watcher: this rank's signal watcher.
        check_every: calls between rounds (>= 1).
        name: names this manager's rounds in the store, the same on every rank and unique to this
            manager (a random token rank 0 drew), so managers and process groups never share a key.
        store: the store to agree through; None: a connection of its own to the process group's
            store (:meth:`Group.store_connection`), made at the first round.

    Attributes:
        agreed: a notice arrived (on any rank, with many), as of the last :meth:`poll`.
    """

    def __init__(
        self, group: Group, watcher: PreemptionWatcher, check_every: int, name: str, store: Any = None
    ) -> None:
        self._group, self._watcher = group, watcher
        self.check_every = check_every
        self._name = name
        self._calls = 0
        self.agreed = False
        self._store: Any = store

    @property
    def received(self) -> bool:
        """With many ranks, :attr:`agreed` (so every rank answers alike); on one, whether a notice
        arrived by now."""
        return self.agreed or (not self._group.distributed and self._watcher.received.is_set())

    def poll(self, step: int) -> bool:
        """:attr:`agreed` after this call of ``should_save(step)``, agreeing with the other ranks
        if this call is a round."""
        if not self._group.distributed:
            self.agreed = self.agreed or self._watcher.received.is_set()
            return self.agreed
        calls, self._calls = self._calls, self._calls + 1
        if self.agreed or calls % self.check_every:
            return self.agreed
        if self._store is None:
            self._store = self._group.store_connection()
        self.agreed = self._group.any_through_store(
            self._watcher.received.is_set(),
            f"snapshotkit/notice/{self._name}/{calls // self.check_every}",
            f"SnapshotManager.should_save(step={step}): agreeing on a preemption notice",
            self._store,
        )
        return self.agreed

    def close(self) -> None:
        """Drop the store connection (a new one is made if :meth:`poll` runs again)."""
        self._store = None
