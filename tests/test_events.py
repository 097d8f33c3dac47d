"""Lifecycle events (``snapshotkit.events``) and the take/restore log lines."""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import threading
from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict, _events, events
from snapshotkit._events import current_step, emit, step_scope, transfer_summary
from snapshotkit.errors import SnapshotExistsError, StorageError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/
import _storage_doubles

_storage_doubles.register()

EXECUTORS = ["thread", "process"]
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


def _state() -> dict[str, StateDict]:
    return {"s": StateDict(a=torch.arange(1000.0), b=torch.ones(3, 5), tag="run")}


def _stored_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path, "data").iterdir())


# ------------------------------------------------------------------ take and async_take


def test_take_reports_started_staged_committed(tmp_path: Path, seen: Seen) -> None:
    path = str(tmp_path / "snap")
    Snapshot.take(path, _state())
    assert seen.kinds == ["take_started", "take_staged", "take_committed"]
    started, staged, committed = seen.events
    assert {e.path for e in seen.events} == {path}
    assert {e.rank for e in seen.events} == {0}
    assert {e.step for e in seen.events} == {None}
    assert {e.error for e in seen.events} == {None}
    assert started.nbytes is None and started.seconds is None
    assert staged.nbytes == committed.nbytes == _stored_bytes(path)
    assert staged.seconds is not None and committed.seconds is not None
    assert 0 < staged.seconds <= committed.seconds
    assert set(seen.threads) == {threading.current_thread().name}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_async_take_reports_staged_on_return_and_commits_from_the_coordinator(
    tmp_path: Path, seen: Seen, executor: str
) -> None:
    path = str(tmp_path / "snap")
    pending = Snapshot.async_take(path, _state(), executor=executor)
    assert seen.kinds[:2] == ["take_started", "take_staged"]  # before async_take returned
    pending.wait()
    assert seen.kinds == ["take_started", "take_staged", "take_committed"]  # before wait returned
    assert seen.of("take_staged").nbytes == seen.of("take_committed").nbytes == _stored_bytes(path)
    caller = threading.current_thread().name
    assert seen.threads[:2] == [caller, caller]
    assert seen.threads[2] != caller  # the coordinator thread


def test_take_onto_an_existing_snapshot_reports_the_error_it_raises(tmp_path: Path, seen: Seen) -> None:
    path = str(tmp_path / "snap")
    Snapshot.take(path, _state())
    seen.events.clear()
    with pytest.raises(SnapshotExistsError) as info:
        Snapshot.take(path, _state())
    assert seen.kinds == ["take_started", "take_failed"]
    failed = seen.of("take_failed")
    assert failed.error is info.value
    assert failed.path == path and failed.nbytes is None
    assert failed.seconds is not None and failed.seconds >= 0


def test_a_failing_write_reports_take_failed_and_no_staged(tmp_path: Path, seen: Seen) -> None:
    uri = f"failing://{tmp_path / 'snap'}"
    with pytest.raises(StorageError, match="No space left on device") as info:
        Snapshot.take(uri, _state())
    assert seen.kinds == ["take_started", "take_failed"]  # take's data is staged once written
    assert seen.of("take_failed").error is info.value


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_failing_background_write_reports_the_error_wait_raises(tmp_path: Path, seen: Seen, executor: str) -> None:
    uri = f"failing://{tmp_path / 'snap'}"
    pending = Snapshot.async_take(uri, _state(), executor=executor)
    with pytest.raises(StorageError, match="No space left on device") as info:
        pending.wait()
    assert seen.kinds == ["take_started", "take_staged", "take_failed"]
    assert seen.of("take_failed").error is info.value


def test_an_invalid_app_state_reports_take_failed(tmp_path: Path, seen: Seen) -> None:
    with pytest.raises(TypeError) as info:
        Snapshot.take(str(tmp_path / "snap"), {"s": object()})  # type: ignore[dict-item]
    assert seen.kinds == ["take_started", "take_failed"]
    assert seen.of("take_failed").error is info.value


# ------------------------------------------------------------------ restore and read_object


def test_restore_reports_the_bytes_it_read_and_read_object_nothing(tmp_path: Path, seen: Seen) -> None:
    path = str(tmp_path / "snap")
    Snapshot.take(path, _state())
    seen.events.clear()
    fresh = StateDict(a=torch.zeros(1000), b=torch.zeros(3, 5), tag="")
    Snapshot(path).restore({"s": fresh})
    assert torch.equal(fresh["a"], torch.arange(1000.0)) and fresh["tag"] == "run"
    assert seen.kinds == ["restore_finished"]
    finished = seen.events[0]
    assert finished.path == path and finished.rank == 0 and finished.error is None
    assert finished.nbytes is not None and 4000 + 60 <= finished.nbytes <= _stored_bytes(path)
    assert finished.seconds is not None and finished.seconds > 0
    seen.events.clear()
    Snapshot(path).read_object("s/a")
    Snapshot(path).read_object("s")
    assert seen.events == []


def test_a_failing_restore_reports_nothing(tmp_path: Path, seen: Seen) -> None:
    path = str(tmp_path / "snap")
    Snapshot.take(path, _state())
    seen.events.clear()
    with pytest.raises(KeyError):
        Snapshot(path).restore({"missing": StateDict()})
    assert seen.events == []


# ------------------------------------------------------------------ steps


def test_step_scope_tags_every_event_of_take_and_restore(tmp_path: Path, seen: Seen) -> None:
    path = str(tmp_path / "snap")
    assert current_step() is None
    with step_scope(10):
        assert current_step() == 10
        Snapshot.take(path, _state())
        with step_scope(11):
            Snapshot(path).restore(_state())
        assert current_step() == 10
    assert current_step() is None
    assert [(e.kind, e.step) for e in seen.events] == [
        ("take_started", 10),
        ("take_staged", 10),
        ("take_committed", 10),
        ("restore_finished", 11),
    ]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_async_take_events_carry_the_step_it_started_in(tmp_path: Path, seen: Seen, executor: str) -> None:
    with step_scope(42):
        pending = Snapshot.async_take(str(tmp_path / "snap"), _state(), executor=executor)
    with step_scope(43):  # the step when waiting does not matter
        pending.wait()
    assert [e.step for e in seen.events] == [42, 42, 42]
    assert seen.threads[2] != threading.current_thread().name  # committed on the coordinator thread


def test_failed_background_take_carries_its_step(tmp_path: Path, seen: Seen) -> None:
    with step_scope(7):
        pending = Snapshot.async_take(f"failing://{tmp_path / 'snap'}", _state())
    with pytest.raises(StorageError):
        pending.wait()
    assert seen.of("take_failed").step == 7


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


def test_a_raising_callback_is_logged_and_the_take_still_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: events.Event) -> None:
        raise ValueError(f"broken callback on {event.kind}")

    recorder = Seen()
    events.subscribe(broken)
    events.subscribe(recorder)
    path = str(tmp_path / "snap")
    with caplog.at_level(logging.WARNING, logger="snapshotkit.events"):
        Snapshot.take(path, _state())
    assert Snapshot(path).read_object("s/tag") == "run"
    assert recorder.kinds == ["take_started", "take_staged", "take_committed"]  # after the broken one
    records = [r for r in caplog.records if r.name == "snapshotkit.events"]
    assert len(records) == 3
    assert all(r.levelno >= logging.WARNING for r in records)
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], ValueError) for r in records)
    assert "broken callback on take_committed" in caplog.text  # the traceback is in the log


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


# ------------------------------------------------------------------ logging


def test_transfer_summary() -> None:
    assert transfer_summary(1 << 30, 2.31) == "1.00 GiB in 2.31 s (0.43 GiB/s)"
    assert transfer_summary(3 << 20, 0.5) == "3.00 MiB in 0.50 s (0.01 GiB/s)"
    assert transfer_summary(1000, 0.25) == "1000 B in 0.25 s (0.00 GiB/s)"


_LINE = r"{} snapshot {}: 4 entries, [0-9.]+ (B|KiB|MiB) in [0-9.]+ s \([0-9.]+ GiB/s\), rank 0 of 1"
_BLOCKED = r", caller blocked [0-9.]+ s"


def test_a_healthy_run_logs_one_info_line_per_take_and_restore_and_nothing_worse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = [str(tmp_path / name) for name in ("take", "thread", "process")]
    with caplog.at_level(logging.DEBUG):
        Snapshot.take(paths[0], _state())
        Snapshot.async_take(paths[1], _state(), executor="thread").wait()
        Snapshot.async_take(paths[2], _state(), executor="process").wait()
        Snapshot(paths[0]).restore(_state())
        Snapshot(paths[0]).read_object("s/a")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    infos = [(r.name, r.getMessage()) for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 4, infos
    expected = [
        ("snapshotkit.take", _LINE.format("took", re.escape(paths[0]))),
        ("snapshotkit.take", _LINE.format("took", re.escape(paths[1])) + _BLOCKED),
        ("snapshotkit.take", _LINE.format("took", re.escape(paths[2])) + _BLOCKED),
        ("snapshotkit.restore", _LINE.format("restored", re.escape(paths[0]))),
    ]
    for (name, message), (want_name, pattern) in zip(infos, expected, strict=True):
        assert name == want_name and re.fullmatch(pattern, message), message
