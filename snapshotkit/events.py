"""Lifecycle events: subscribe to what happens to snapshots in this process.

::

    from snapshotkit import events

    def on_event(event: events.Event) -> None:
        if event.kind == "take_committed":
            metrics.log(step=event.step, checkpoint_seconds=event.seconds, checkpoint_bytes=event.nbytes)

    unsubscribe = events.subscribe(on_event)

Every rank emits its own events, with its rank. For each ``take`` or ``async_take``:
``take_started``, then ``take_staged`` (staging done: ``async_take`` returns to the caller), then
exactly one of ``take_committed`` and ``take_failed`` (which carries the error the caller gets);
a take that fails before staging finished emits no ``take_staged``. ``restore_finished`` follows
each successful ``restore``; ``read_object`` emits nothing. ``snapshot_deleted`` and
``incomplete_removed`` are emitted by code that deletes snapshots or the leftovers of takes
that never committed. docs/events.md describes every field.
"""

from __future__ import annotations

from snapshotkit._events import Event, EventKind, subscribe

__all__ = ["Event", "EventKind", "subscribe"]
