"""SnapshotManager on one process: saving, retention, resuming, clean-up, arguments, events."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import files_of, plant_snapshot_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle._runs import make_state, memory_root, same_weights, train_step, weights
from snapshotkit import PendingSnapshot, Snapshot, SnapshotManager, StateDict, events
from snapshotkit._lifecycle.catalog import MANAGER_KEY
from snapshotkit._lifecycle.retention import RetentionPolicy, StepRecord, kept_steps
from snapshotkit.errors import (
    ConfigError,
    InvalidArgumentError,
    SnapshotExistsError,
    SnapshotNotFoundError,
    StateMismatchError,
)

MANIFEST = ".snapshot_metadata"


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.fixture
def recorded() -> Any:
    seen: list[events.Event] = []
    unsubscribe = events.subscribe(seen.append)
    yield seen
    unsubscribe()


def run_loop(mgr: SnapshotManager, state: dict[str, Any], steps: int, **save: Any) -> dict[int, dict[str, Any]]:
    """Train ``steps`` steps, saving whenever the manager says so; weights saved by step."""
    saved: dict[int, dict[str, Any]] = {}
    step = state["progress"]["step"]
    while step < steps:
        loss = train_step(state)
        step += 1
        if mgr.should_save(step):
            mgr.save(step, state, metrics={"loss": loss}, **save)
            saved[step] = weights(state)
    mgr.wait()
    return saved


def test_a_loop_keeps_the_last_three_and_resumes_bit_exact() -> None:
    root = memory_root("loop")
    with SnapshotManager(root, keep_last=3, save_interval_steps=10) as mgr:
        state = make_state()
        saved = run_loop(mgr, state, 95)
        assert mgr.steps() == [70, 80, 90]
        assert mgr.latest_step() == 90
        final = weights(state)

    fresh = make_state(seed=1)
    with SnapshotManager(root, keep_last=3, save_interval_steps=10) as mgr:
        assert mgr.restore_latest(fresh) == 90
        assert fresh["progress"]["step"] == 90
        assert same_weights(weights(fresh), saved[90])
        assert not same_weights(weights(fresh), final)
        # resuming continues exactly as the first run did from step 90
        assert not mgr.should_save(90)  # already saved
        assert mgr.metrics(90).keys() == {"loss"}
        meta = mgr.snapshot(90).metadata.user_metadata[MANAGER_KEY]
        assert meta == {"step": 90, "metrics": mgr.metrics(90), "reason": "interval"}


def test_resume_through_the_manager_continues_the_same_run() -> None:
    root = memory_root("resume")
    reference = make_state()
    for _ in range(30):
        train_step(reference)
    with SnapshotManager(root, keep_last=2, save_interval_steps=10) as mgr:
        state = make_state()
        run_loop(mgr, state, 25)  # "crashes" after step 25, last save at 20
    resumed = make_state(seed=7)
    with SnapshotManager(root, keep_last=2, save_interval_steps=10) as mgr:
        assert mgr.restore_latest(resumed) == 20
        run_loop(mgr, resumed, 30)
        assert mgr.steps() == [20, 30]
    assert same_weights(weights(resumed), weights(reference))


def test_nothing_to_resume_from() -> None:
    with SnapshotManager(memory_root("empty")) as mgr:
        assert mgr.restore_latest(make_state()) is None
        assert mgr.steps() == [] and mgr.latest_step() is None


def test_keep_every_and_keep_best(tmp_path: Path) -> None:
    losses = {10: 0.9, 20: 0.2, 30: 0.5, 40: 0.1, 50: 0.8, 60: 0.7, 70: 0.6}
    state = {"progress": StateDict(step=0)}
    with SnapshotManager(
        str(tmp_path), keep_last=1, keep_every=30, best_metric="loss", best_mode="min", keep_best=2
    ) as mgr:
        for step, loss in losses.items():
            mgr.save(step, state, metrics={"loss": torch.tensor(loss)})
        mgr.wait()
        assert mgr.steps() == [20, 30, 40, 60, 70]
        assert mgr.best_step() == 40
        assert mgr.metrics(20) == {"loss": pytest.approx(0.2)}
    # deleted snapshots leave no directories behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_20", "step_30", "step_40", "step_60", "step_70"]


def test_non_finite_metrics_are_stored_as_none_and_never_best() -> None:
    with SnapshotManager(memory_root("nan"), best_metric="loss", keep_best=1) as mgr:
        mgr.save(1, {"s": StateDict(a=1)}, metrics={"loss": 0.5})
        mgr.save(2, {"s": StateDict(a=2)}, metrics={"loss": float("nan")})
        mgr.wait()
        assert mgr.metrics(2) == {"loss": None}
        assert mgr.best_step() == 1
        assert mgr.steps() == [1, 2]  # the newest is always kept


def test_saving_an_existing_step_raises_and_should_save_says_no() -> None:
    with SnapshotManager(memory_root("exists"), save_interval_steps=5) as mgr:
        state = {"s": StateDict(a=1)}
        assert mgr.should_save(5)
        mgr.save(5, state)
        assert not mgr.should_save(5)
        with pytest.raises(SnapshotExistsError, match="step 5"):
            mgr.save(5, state)
        assert not mgr.should_save(6) and mgr.should_save(10)


def test_a_snapshot_taken_there_by_hand_is_refused_too() -> None:
    root = memory_root("byhand")
    Snapshot.take(f"{root}/step_3", {"s": StateDict(a=1)})
    with SnapshotManager(root) as mgr, pytest.raises(SnapshotExistsError):
        mgr.save(3, {"s": StateDict(a=2)})


def test_async_saves_one_in_flight_and_retention_after_commit() -> None:
    root = memory_root("async")
    with SnapshotManager(root, keep_last=2) as mgr:
        state = make_state()
        pendings = []
        for step in (1, 2, 3, 4):
            train_step(state)
            result = mgr.save(step, state, async_take=True, metrics={"loss": 1.0 / step})
            assert isinstance(result, PendingSnapshot)
            pendings.append((result, weights(state)))
        mgr.wait()
        assert all(p.done() for p, _ in pendings)
        assert mgr.steps() == [3, 4]
        expected = pendings[-1][1]
    fresh = make_state(seed=3)
    with SnapshotManager(root) as mgr:
        assert mgr.restore_latest(fresh) == 4
    assert same_weights(weights(fresh), expected)


def test_user_metadata_travels_with_the_snapshot() -> None:
    with SnapshotManager(memory_root("meta")) as mgr:
        snap = mgr.save(7, {"s": StateDict(a=1)}, metadata={"commit": "abc123", "lr": [0.1, 0.01]})
        assert isinstance(snap, Snapshot)
        user = Snapshot(snap.path).metadata.user_metadata
        assert user["commit"] == "abc123" and user["lr"] == [0.1, 0.01]
        assert user[MANAGER_KEY]["reason"] == "manual"


# --------------------------------------------------------------------------- damaged and foreign snapshots


def take_steps(root: str, steps: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    state = make_state()
    saved = {}
    with SnapshotManager(root) as mgr:
        for step in steps:
            train_step(state)
            mgr.save(step, state)
            saved[step] = weights(state)
    return saved


def first_data_object(snapshot_dir: Path) -> Path:
    return sorted((snapshot_dir / "data").iterdir())[0]


def test_corrupt_latest_is_skipped_with_a_warning(tmp_path: Path) -> None:
    saved = take_steps(str(tmp_path), [10, 20])
    data = first_data_object(tmp_path / "step_20")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    fresh = make_state(seed=5)
    with SnapshotManager(str(tmp_path)) as mgr:
        with pytest.warns(RuntimeWarning, match=r"step 20 .*ChecksumMismatchError"):
            assert mgr.restore_latest(fresh) == 10
        assert mgr.steps() == [10, 20]  # a damaged snapshot is reported, not deleted
    assert same_weights(weights(fresh), saved[10])


def test_damaged_manifest_and_incomplete_snapshots_are_skipped(tmp_path: Path) -> None:
    saved = take_steps(str(tmp_path), [1, 2, 3])
    manifest = tmp_path / "step_3" / MANIFEST
    text = bytearray(manifest.read_bytes())
    text[-10] ^= 0x20
    manifest.write_bytes(bytes(text))
    (tmp_path / "step_2" / MANIFEST).unlink()  # as if the take of step 2 never committed
    fresh = make_state(seed=5)
    with SnapshotManager(str(tmp_path), cleanup_incomplete=False) as mgr:
        assert mgr.steps() == [1, 3]
        with pytest.warns(RuntimeWarning, match=r"step 3 .*Manifest"):
            assert mgr.restore_latest(fresh) == 1
    assert same_weights(weights(fresh), saved[1])


def test_a_state_that_does_not_match_raises_instead_of_falling_back(tmp_path: Path) -> None:
    take_steps(str(tmp_path), [1, 2])
    wrong = make_state()
    wrong["model"] = torch.nn.Linear(5, 3)
    with SnapshotManager(str(tmp_path)) as mgr, pytest.raises(StateMismatchError):
        mgr.restore_latest(wrong)


def test_cleanup_removes_incomplete_snapshots_but_nothing_foreign(tmp_path: Path, recorded: Any) -> None:
    take_steps(str(tmp_path), [1, 2])
    (tmp_path / "step_2" / MANIFEST).unlink()
    (tmp_path / "step_5" / "data").mkdir(parents=True)
    (tmp_path / "step_5" / "data" / "0_00000_deadbeef").write_bytes(b"x")
    (tmp_path / "step_6").mkdir()
    (tmp_path / "step_6" / ".metadata").write_bytes(b"a DCP checkpoint")  # foreign: never deleted
    (tmp_path / "step_6" / "__0_0.distcp").write_bytes(b"shards")
    (tmp_path / "notes.txt").write_text("mine")
    with SnapshotManager(str(tmp_path)) as mgr:
        assert mgr.steps() == [1]
        assert mgr.cleanup() == []
    assert files_under(tmp_path / "step_6") == [".metadata", "__0_0.distcp"]
    assert not (tmp_path / "step_2").exists() and not (tmp_path / "step_5").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    removed = [(e.kind, e.step) for e in recorded if e.kind == "incomplete_removed"]
    assert sorted(removed) == [("incomplete_removed", 2), ("incomplete_removed", 5)]


def test_retention_never_deletes_what_the_manager_did_not_write(tmp_path: Path, recorded: Any) -> None:
    Snapshot.take(str(tmp_path / "step_1"), {"s": StateDict(a=1)})  # by hand: no manager record
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_2" / "weights.safetensors").write_bytes(b"x")
    with SnapshotManager(str(tmp_path), keep_last=1) as mgr:
        for step in (3, 4, 5):
            mgr.save(step, {"s": StateDict(a=step)})
        mgr.wait()
        assert mgr.steps() == [1, 5]
    assert (tmp_path / "step_2" / "weights.safetensors").exists()
    deleted = [(e.kind, e.step, e.path) for e in recorded if e.kind == "snapshot_deleted"]
    assert deleted == [("snapshot_deleted", s, f"{tmp_path}/step_{s}") for s in (3, 4)]


def test_foreign_empty_directories_in_a_step_directory_survive(tmp_path: Path) -> None:
    (tmp_path / "step_5" / "tensorboard" / "run1").mkdir(parents=True)  # a user's, empty
    (tmp_path / "step_6" / "data").mkdir(parents=True)  # what a take killed at once leaves
    with SnapshotManager(str(tmp_path), keep_last=1) as mgr:
        assert mgr.cleanup() == []
    assert (tmp_path / "step_5" / "tensorboard" / "run1").is_dir()
    assert not (tmp_path / "step_6").exists()


def test_a_snapshot_replaced_after_it_was_listed_is_not_deleted(tmp_path: Path) -> None:
    with SnapshotManager(str(tmp_path), keep_last=1) as mgr:
        mgr.save(1, {"s": StateDict(a=1)})
        mgr.wait()
        # someone replaces step 1 with a snapshot of their own; the manager has step 1 cached as its own
        for path in sorted((tmp_path / "step_1").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        Snapshot.take(str(tmp_path / "step_1"), {"s": StateDict(theirs=True)})
        mgr.save(2, {"s": StateDict(a=2)})
        mgr.wait()
        assert mgr.steps() == [1, 2]
    assert Snapshot(str(tmp_path / "step_1")).read_object("s/theirs") is True


def test_deletion_cut_short_never_opens_and_is_cleaned_up(tmp_path: Path) -> None:
    take_steps(str(tmp_path), [1, 2])
    # the state a deletion leaves when killed right after its first step: no manifest
    (tmp_path / "step_1" / MANIFEST).unlink()
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(tmp_path / "step_1")).metadata
    with SnapshotManager(str(tmp_path)) as mgr:
        assert mgr.steps() == [2]
    assert not (tmp_path / "step_1").exists()


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m, s: m.save("1", s), InvalidArgumentError),
        (lambda m, s: m.save(True, s), InvalidArgumentError),
        (lambda m, s: m.save(-1, s), ConfigError),
        (lambda m, s: m.save(1, s, metrics=[1.0]), InvalidArgumentError),
        (lambda m, s: m.save(1, s, metrics={"loss": "low"}), ConfigError),
        (lambda m, s: m.save(1, s, metrics={1: 0.5}), InvalidArgumentError),
        (lambda m, s: m.save(1, s, metadata={MANAGER_KEY: 1}), ConfigError),
        (lambda m, s: m.save(1, s, metadata="x"), InvalidArgumentError),
        (lambda m, s: m.save(1, s, storage_options={}), InvalidArgumentError),
        (lambda m, s: m.save(1, s, async_take="yes"), ConfigError),
        (lambda m, s: m.should_save(1.0), InvalidArgumentError),
    ],
)
def test_careless_arguments_are_refused_before_anything_is_written(call: Any, error: type[Exception]) -> None:
    root = memory_root("args")
    with SnapshotManager(root) as mgr:
        with pytest.raises(error):
            call(mgr, {"s": StateDict(a=1)})
        assert mgr.steps() == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"keep_last": 0}, ConfigError),
        ({"keep_best": 1}, ConfigError),
        ({"save_interval_steps": 0}, ConfigError),
        ({"save_interval_steps": 2.5}, InvalidArgumentError),
        ({"best_mode": "up"}, ConfigError),
        ({"preemption_signals": "SIGTERM"}, InvalidArgumentError),
        ({"preemption_signals": [9]}, ConfigError),
        ({"cleanup_incomplete": 1}, InvalidArgumentError),
    ],
)
def test_bad_manager_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        SnapshotManager(memory_root("bad"), **kwargs)


def test_a_closed_manager_saves_no_more() -> None:
    mgr = SnapshotManager(memory_root("closed"))
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(ConfigError, match="closed"):
        mgr.save(1, {"s": StateDict(a=1)})


def test_best_step_needs_a_metric() -> None:
    with SnapshotManager(memory_root("nometric")) as mgr, pytest.raises(ConfigError, match="best_metric"):
        mgr.best_step()


def test_snapshot_of_an_unknown_step_lists_the_steps() -> None:
    with SnapshotManager(memory_root("unknown")) as mgr:
        mgr.save(4, {"s": StateDict(a=1)})
        with pytest.raises(SnapshotNotFoundError, match="committed steps: 4"):
            mgr.snapshot(5)


# --------------------------------------------------------------------------- events and logging


def test_events_and_info_lines_of_a_managed_run(recorded: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="snapshotkit")
    root = memory_root("events")
    with SnapshotManager(root, keep_last=1) as mgr:
        mgr.save(1, {"s": StateDict(a=1)})
        mgr.save(2, {"s": StateDict(a=2)}, async_take=True)
        mgr.wait()
        mgr.restore_latest({"s": StateDict(a=0)})
    kinds = [(e.kind, e.step) for e in recorded]
    assert kinds[:3] == [("take_started", 1), ("take_staged", 1), ("take_committed", 1)]
    assert ("take_committed", 2) in kinds and ("snapshot_deleted", 1) in kinds
    assert kinds[-1] == ("restore_finished", 2)
    assert kinds.index(("take_committed", 2)) < kinds.index(("snapshot_deleted", 1))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- retention, as a property


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    saves=st.lists(st.tuples(st.integers(1, 7), st.one_of(st.none(), st.floats(-10, 10))), min_size=1, max_size=12),
    keep_last=st.one_of(st.none(), st.integers(1, 4)),
    keep_every=st.one_of(st.none(), st.integers(2, 12)),
    keep_best=st.one_of(st.none(), st.integers(1, 3)),
    best_mode=st.sampled_from(["min", "max"]),
    async_every=st.integers(0, 3),
)
def test_any_sequence_of_saves_keeps_exactly_the_set_the_policy_names(
    saves: list[tuple[int, float | None]],
    keep_last: int | None,
    keep_every: int | None,
    keep_best: int | None,
    best_mode: str,
    async_every: int,
) -> None:
    policy = RetentionPolicy(keep_last, keep_every, keep_best, "val", best_mode)  # type: ignore[arg-type]
    history: list[StepRecord] = []
    step = 0
    with SnapshotManager(
        memory_root("property"),
        keep_last=keep_last,
        keep_every=keep_every,
        keep_best=keep_best,
        best_metric="val",
        best_mode=best_mode,
    ) as mgr:
        for index, (gap, value) in enumerate(saves):
            step += gap
            metrics = {} if value is None else {"val": value}
            use_async = async_every > 0 and index % async_every == 0
            mgr.save(step, {"s": StateDict(step=step)}, metrics=metrics, async_take=use_async)
            history.append(StepRecord(step, metrics))
        mgr.wait()
        assert set(mgr.steps()) == kept_steps(history, policy)


def test_nothing_is_left_in_memory_store_of_deleted_snapshots() -> None:
    from snapshotkit.storage._memory import _STORE

    root = memory_root("leftovers")
    with SnapshotManager(root, keep_last=1) as mgr:
        for step in range(1, 6):
            mgr.save(step, {"s": StateDict(step=step)})
        mgr.wait()
    prefix = root.removeprefix("memory://") + "/"
    assert {k.removeprefix(prefix).split("/")[0] for k in _STORE if k.startswith(prefix)} == {"step_5"}


def test_no_temporary_files_left_after_a_local_run(tmp_path: Path) -> None:
    with SnapshotManager(str(tmp_path), keep_last=2, save_interval_steps=2) as mgr:
        run_loop(mgr, make_state(), 9)
    assert [p for p in files_under(tmp_path) if ".tmp" in p] == []
    assert sorted(os.listdir(tmp_path)) == ["step_6", "step_8"]


def test_a_snapshot_at_the_root_is_reported_once_and_is_never_a_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the manager said nothing of it (and ls, info described it or nothing).
    root = tmp_path / "run"
    state = make_state()
    with SnapshotManager(str(root), preemption_signals=(), async_executor=None) as mgr:
        mgr.save(1, state)
    plant_snapshot_at(root)
    stray = {name: data for name, data in files_of(root).items() if not name.startswith("step_")}
    caplog.set_level(logging.WARNING, logger="snapshotkit.manager")
    with SnapshotManager(str(root), keep_last=1, preemption_signals=(), async_executor=None) as mgr:
        for step in (2, 3):
            train_step(state)
            mgr.save(step, state, async_take=step == 3)
        mgr.wait()
        assert mgr.steps() == [3] and mgr.latest_step() == 3
        assert mgr.restore_latest(make_state(seed=1)) == 3
        mgr.cleanup()
    reported = [r.getMessage() for r in caplog.records if "snapshot at the root itself" in r.getMessage()]
    assert len(reported) == 1, reported
    assert "never restored nor deleted" in reported[0] and f"`snapshotkit ls {root}`" in reported[0]
    assert {name: data for name, data in files_of(root).items() if not name.startswith("step_")} == stray
    assert Snapshot(str(root)).metadata.world_size == 1  # still there, untouched
