"""Lifecycle events: the value, the subscriber list, and how snapshotkit emits them.

The public names (:class:`Event`, :data:`EventKind`, :func:`subscribe`) are re-exported by
:mod:`snapshotkit.events`; the rest is for snapshotkit's own modules (and the snapshot manager):
:func:`emit`, :func:`step_scope` and :func:`current_step`.

IMPORTANT: emitting must never break the operation it reports, and must cost nothing when nobody
listens. So :func:`emit` returns before building an :class:`Event` when there is no subscriber,
and a callback that raises is logged (logger ``snapshotkit.events``) and skipped.

Thread safety: events come from the caller's thread and from ``async_take``'s coordinator
thread. The subscriber list is an immutable tuple, replaced (under a lock) on every change and
read without one, so a callback may subscribe or unsubscribe, even itself, while events fire.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Final, Literal

__all__ = [
    "CURRENT_STEP",
    "Event",
    "EventKind",
    "current_step",
    "emit",
    "step_scope",
    "subscribe",
    "transfer_summary",
]

logger = logging.getLogger("snapshotkit.events")

EventKind = Literal[
    "take_started",
    "take_staged",
    "take_committed",
    "take_failed",
    "restore_finished",
    "snapshot_deleted",
    "incomplete_removed",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened to a snapshot, on one rank.

    Attributes:
        kind: what happened (see :data:`EventKind`).
        path: the snapshot's path (rank 0's, for a take on several ranks).
        step: the training step the event belongs to (from a step scope), or None.
        rank: the rank that emitted the event.
        nbytes: the bytes this rank staged, wrote or read, where that applies.
        seconds: how long it took, from the start of the take or restore, where that applies.
        error: for ``take_failed``, the exception the take raised to the caller.
        referenced_bytes: for ``take_committed`` of an incremental take, the bytes of pieces this
            rank referenced in base snapshots instead of writing them (``nbytes`` is then what
            it wrote); 0 for a full take.
        received_bytes: for ``restore_finished``, the bytes this rank received from other ranks
            instead of reading them from storage (replicated pieces another rank read once for
            the group; ``nbytes`` is then what it read itself); 0 when nothing was shared.
    """

    kind: EventKind
    path: str
    step: int | None = None
    rank: int = 0
    nbytes: int | None = None
    seconds: float | None = None
    error: BaseException | None = None
    referenced_bytes: int | None = None
    received_bytes: int | None = None


class _Current(enum.Enum):
    STEP = "the step of the current step scope"


#: The default of :func:`emit`'s ``step``: the step of the enclosing :func:`step_scope`.
CURRENT_STEP: Final = _Current.STEP

_step: contextvars.ContextVar[int | None] = contextvars.ContextVar("snapshotkit_step", default=None)
_lock = threading.Lock()
_subscribers: tuple[tuple[object, Callable[[Event], None]], ...] = ()


def subscribe(callback: Callable[[Event], None]) -> Callable[[], None]:
    """Call ``callback`` with every :class:`Event` snapshotkit emits in this process, from now on.

    Callbacks run synchronously on the thread that emits: the caller's for ``take``, ``restore``
    and most of ``async_take``, a background coordinator thread for ``async_take``'s
    ``take_committed`` and ``take_failed`` (before ``PendingSnapshot.wait`` returns). Keep them
    quick; hand slow work to a queue. A callback that raises is logged (logger
    ``snapshotkit.events``, with the traceback) and never stops the take or restore, nor the
    other callbacks.

    Args:
        callback: called with each event. The same callback subscribed twice is called twice.

    Returns:
        A function that unsubscribes ``callback`` (this subscription only); calling it again
        does nothing.
    """
    global _subscribers
    token = object()
    with _lock:
        _subscribers = (*_subscribers, (token, callback))

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            _subscribers = tuple(item for item in _subscribers if item[0] is not token)

    return unsubscribe


def current_step() -> int | None:
    """The step of the innermost :func:`step_scope` in this context, or None."""
    return _step.get()


@contextlib.contextmanager
def step_scope(step: int | None) -> Iterator[None]:
    """Tag the events emitted inside the ``with`` block, in this context, with ``step``.

    The scope follows :mod:`contextvars`: other threads do not see it, so work that emits on
    another thread captures :func:`current_step` first and passes it to :func:`emit`.
    """
    reset = _step.set(step)
    try:
        yield
    finally:
        _step.reset(reset)


def emit(
    kind: EventKind,
    *,
    path: str,
    rank: int = 0,
    nbytes: int | None = None,
    seconds: float | None = None,
    error: BaseException | None = None,
    step: int | _Current | None = CURRENT_STEP,
    referenced_bytes: int | None = None,
    received_bytes: int | None = None,
) -> None:
    """Deliver an :class:`Event` to every subscriber; nothing at all when there is none.

    Args:
        step: the event's step; by default the step of the current :func:`step_scope`.
        Others: the :class:`Event` fields.
    """
    subscribers = _subscribers
    if not subscribers:
        return
    event = Event(
        kind=kind,
        path=path,
        step=_step.get() if isinstance(step, _Current) else step,
        rank=rank,
        nbytes=nbytes,
        seconds=seconds,
        error=error,
        referenced_bytes=referenced_bytes,
        received_bytes=received_bytes,
    )
    for _, callback in subscribers:
        try:
            callback(event)
        except Exception:
            logger.exception("an events callback, %r, raised on %r; snapshotkit ignored it", callback, event)


def format_bytes(nbytes: int) -> str:
    """A byte count for log lines: ``"512 B"``, ``"1.00 GiB"``."""
    amount = f"{nbytes} B"
    size = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size /= 1024
        amount = f"{size:.2f} {unit}"
    return amount


def transfer_summary(nbytes: int, seconds: float) -> str:
    """How much moved how fast, for log lines: ``"1.00 GiB in 2.31 s (0.43 GiB/s)"``."""
    amount = format_bytes(nbytes)
    rate = nbytes / (1 << 30) / seconds if seconds > 0 else float("inf")
    return f"{amount} in {seconds:.2f} s ({rate:.2f} GiB/s)"
