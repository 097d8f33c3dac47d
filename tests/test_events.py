"""Lifecycle events (``snapshotkit.events``): subscribers, steps, emitting."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from snapshotkit import _events, events
from snapshotkit._events import current_step, emit, step_scope, transfer_summary

pytestmark = pytest.mark.timeout(120)


@dataclasses.dataclass
class Seen:
    """Events one subscriber received, and the thread each came from."""

    events: list[events.Event] = dataclasses.field(default_factory=list)
    threads: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, event: events.Event) -> None:
        self.events.append(event)
        self.threads.append(threading.current_thread().name)

    @property
    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    def of(self, kind: str) -> events.Event:
        (event,) = [e for e in self.events if e.kind == kind]
        return event


@pytest.fixture(autouse=True)
def _no_leaked_subscriptions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without subscribers, and whatever it subscribed is gone after it."""
    monkeypatch.setattr(_events, "_subscribers", ())


@pytest.fixture
def seen() -> Seen:
    """A recorder subscribed for the test."""
    recorder = Seen()
    events.subscribe(recorder)
    return recorder


# ------------------------------------------------------------------ steps


def test_step_scope_is_not_seen_by_other_threads() -> None:
    steps: list[int | None] = []
    with step_scope(3):
        thread = threading.Thread(target=lambda: steps.append(current_step()))
        thread.start()
        thread.join()
    assert steps == [None]


def test_emit_takes_the_scope_step_unless_given_one(seen: Seen) -> None:
    with step_scope(5):
        emit("snapshot_deleted", path="/ckpt/step_1")
        emit("incomplete_removed", path="/ckpt/step_2", step=None)
        emit("snapshot_deleted", path="/ckpt/step_3", step=9, rank=2)
    assert [(e.kind, e.path, e.step, e.rank) for e in seen.events] == [
        ("snapshot_deleted", "/ckpt/step_1", 5, 0),
        ("incomplete_removed", "/ckpt/step_2", None, 0),
        ("snapshot_deleted", "/ckpt/step_3", 9, 2),
    ]


# ------------------------------------------------------------------ subscribers


def test_unsubscribe_stops_delivery_and_is_idempotent(seen: Seen) -> None:
    other = Seen()
    unsubscribe = events.subscribe(other)
    emit("snapshot_deleted", path="a")
    unsubscribe()
    emit("snapshot_deleted", path="b")
    unsubscribe()  # again: nothing happens
    unsubscribe()
    emit("snapshot_deleted", path="c")
    assert [e.path for e in other.events] == ["a"]
    assert [e.path for e in seen.events] == ["a", "b", "c"]  # other subscriptions untouched


def test_the_same_callback_twice_is_two_subscriptions(seen: Seen) -> None:
    first = events.subscribe(seen)
    second = events.subscribe(seen)
    emit("snapshot_deleted", path="a")
    first()
    emit("snapshot_deleted", path="b")
    second()
    emit("snapshot_deleted", path="c")
    assert [e.path for e in seen.events] == ["a", "a", "a", "b", "b", "c"]


def test_a_callback_may_unsubscribe_itself_while_events_fire(seen: Seen) -> None:
    calls: list[str] = []

    def once(event: events.Event) -> None:
        calls.append(event.path)
        unsubscribe()

    unsubscribe = events.subscribe(once)
    emit("snapshot_deleted", path="a")
    emit("snapshot_deleted", path="b")
    assert calls == ["a"]
    assert [e.path for e in seen.events] == ["a", "b"]


def test_subscribe_and_unsubscribe_while_other_threads_emit(seen: Seen) -> None:
    emitters, per_emitter = 3, 2000
    errors: list[BaseException] = []
    stop = threading.Event()

    def emit_many(index: int) -> None:
        try:
            for n in range(per_emitter):
                emit("snapshot_deleted", path=f"{index}/{n}", rank=index)
        except BaseException as exc:
            errors.append(exc)

    def churn() -> None:
        try:
            while not stop.is_set():
                unsubscribes = [events.subscribe(lambda event: None) for _ in range(5)]
                for unsubscribe in unsubscribes:
                    unsubscribe()
                    unsubscribe()
        except BaseException as exc:
            errors.append(exc)

    churners = [threading.Thread(target=churn) for _ in range(2)]
    threads = [threading.Thread(target=emit_many, args=(i,)) for i in range(emitters)]
    for thread in churners + threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    for thread in churners:
        thread.join()
    assert errors == []
    assert len(seen.events) == emitters * per_emitter  # the steady subscriber missed nothing
    for index in range(emitters):  # and each thread's events arrived in order
        mine = [e.path for e in seen.events if e.rank == index]
        assert mine == [f"{index}/{n}" for n in range(per_emitter)]
    assert _events._subscribers == ((_events._subscribers[0][0], seen),)  # every churned subscription is gone


def test_without_subscribers_emit_builds_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _events._subscribers == ()

    def no_event(**fields: object) -> events.Event:
        raise AssertionError("an Event was built with nobody listening")

    monkeypatch.setattr(_events, "Event", no_event)
    emit("take_started", path="/ckpt/step_1")


def test_events_are_frozen_values() -> None:
    event = events.Event(kind="take_started", path="/p", step=None, rank=0, nbytes=None, seconds=None, error=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.path = "/q"  # type: ignore[misc]
    assert event == events.Event(kind="take_started", path="/p")


# ------------------------------------------------------------------ log lines


def test_transfer_summary() -> None:
    assert transfer_summary(1 << 30, 2.31) == "1.00 GiB in 2.31 s (0.43 GiB/s)"
    assert transfer_summary(3 << 20, 0.5) == "3.00 MiB in 0.50 s (0.01 GiB/s)"
    assert transfer_summary(1000, 0.25) == "1000 B in 0.25 s (0.00 GiB/s)"
