"""``Snapshot.async_take``: staging semantics, both executors, faults, exit, many ranks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from snapshotkit import PendingSnapshot, RNGState, Snapshot, StateDict
from snapshotkit._take.executors import checkpoint_daemon_pid
from snapshotkit.errors import (
    CheckpointDaemonError,
    ConfigError,
    SnapshotNotFoundError,
    StorageError,
    WaitTimeoutError,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _storage_doubles

_storage_doubles.register()

EXECUTORS = ["thread", "process"]
pytestmark = pytest.mark.timeout(120)


class Counter:
    """A picklable object leaf with mutable contents."""

    def __init__(self) -> None:
        self.seen = [1, 2, 3]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counter) and other.seen == self.seen


def _app_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[1].weight = torch.nn.Parameter(model[0].weight[:2].clone())
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 8)).sum().backward()
    optim.step()
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    state = StateDict(
        big=torch.randn(3_000_000),  # above the chunk size: several pieces
        strided=base.t(),  # non-contiguous view
        step=5,
        name="run",
        counter=Counter(),
        nested={"list": [torch.ones(3), 7]},
    )
    return {"model": model, "optim": optim, "state": state, "rng": RNGState()}


def _expected(app_state: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in app_state["model"].state_dict().items()},
        "optim": {
            i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for i, s in app_state["optim"].state_dict()["state"].items()
        },
        "big": app_state["state"]["big"].clone(),
        "strided": app_state["state"]["strided"].clone(),
        "rng": (torch.rand(4), random.random(), np.random.rand(2)),
    }


def _mutate(app_state: dict[str, Any]) -> None:
    model, optim, state = app_state["model"], app_state["optim"], app_state["state"]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(-3).add_(1)
    for s in optim.state.values():
        s["exp_avg"].fill_(42)
        s["step"].fill_(1000)
    state["big"].zero_()
    state["strided"].fill_(-1)  # writes through to the base tensor
    state["step"] = 99
    state["name"] = "changed"
    state["counter"].seen.append(4)
    state["nested"]["list"][0].fill_(0)
    state["nested"]["list"].append("new")
    torch.rand(100), random.random(), np.random.rand(5)  # advance every RNG


def _check_restored(path: str, expected: dict[str, Any]) -> None:
    fresh = _app_state()
    _mutate(fresh)
    Snapshot(path).restore(fresh, weights_only=False)  # Counter is our own class
    for name, value in fresh["model"].state_dict().items():
        assert torch.equal(value, expected["model"][name]), name
    for index, s in fresh["optim"].state_dict()["state"].items():
        for key, value in s.items():
            assert torch.equal(value, expected["optim"][index][key]), (index, key)
    state = fresh["state"]
    assert torch.equal(state["big"], expected["big"])
    assert torch.equal(state["strided"], expected["strided"])
    assert state["step"] == 5 and state["name"] == "run"
    assert state["counter"] == Counter()
    assert len(state["nested"]["list"]) == 2 and torch.equal(state["nested"]["list"][0], torch.ones(3))
    draws = (torch.rand(4), random.random(), np.random.rand(2))
    assert torch.equal(draws[0], expected["rng"][0]) and draws[1] == expected["rng"][1]
    assert np.array_equal(draws[2], expected["rng"][2])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_mutating_everything_after_return_does_not_change_the_snapshot(tmp_path: Path, executor: str) -> None:
    app_state = _app_state()
    # The RNG draws right after the take are what a restore must reproduce.
    rng_before = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    pending = Snapshot.async_take(str(tmp_path / "snap"), app_state, executor=executor)
    assert isinstance(pending, PendingSnapshot)
    assert pending.path == str(tmp_path / "snap")
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    expected = _expected(app_state)
    torch.set_rng_state(after[0]), random.setstate(after[1]), np.random.set_state(after[2])
    _mutate(app_state)
    snapshot = pending.wait()
    assert pending.done()
    assert snapshot.path == str(tmp_path / "snap")
    assert torch.equal(rng_before[0], after[0])  # async_take leaves the RNG where it found it
    _check_restored(str(tmp_path / "snap"), expected)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_staging_waits_for_writes_when_the_budget_is_full(
    tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(1 << 20))
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", str(1 << 20))
    monkeypatch.setenv("SNAPSHOTKIT_TEST_WRITE_DELAY", "0.3")
    path = str(tmp_path / "snap")
    state = StateDict(**{f"t{i}": torch.full((256 * 1024,), float(i)) for i in range(6)})  # six 1 MiB objects
    pending = Snapshot.async_take(f"slow://{path}", {"s": state}, memory_budget_bytes=2 << 20, executor=executor)
    returned = time.monotonic()
    # With room for two staged objects, the last four could only be staged after writes drained.
    assert sum(t <= returned for t in _storage_doubles.write_times(path)) >= 4
    pending.wait()
    restored = Snapshot(path).read_object("s")
    assert all(torch.equal(restored[f"t{i}"], torch.full((256 * 1024,), float(i))) for i in range(6))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_failing_storage_makes_wait_raise_and_leaves_nothing(tmp_path: Path, executor: str) -> None:
    path = str(tmp_path / "snap")
    pending = Snapshot.async_take(f"failing://{path}", {"s": StateDict(x=torch.ones(1000))}, executor=executor)
    with pytest.raises(StorageError, match="No space left on device") as info:
        pending.wait()
    assert isinstance(info.value.__cause__, OSError)  # the original error is attached
    assert pending.done()
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(path).metadata
    assert not list(Path(path).glob("data/*"))


def test_wait_timeout_raises_without_harm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_TEST_WRITE_DELAY", "1.0")
    path = str(tmp_path / "snap")
    pending = Snapshot.async_take(f"slow://{path}", {"s": StateDict(x=torch.ones(10))})
    with pytest.raises(WaitTimeoutError, match="still being written") as info:
        pending.wait(timeout=0.05)
    assert isinstance(info.value, TimeoutError)
    assert not pending.done()
    assert torch.equal(pending.wait().read_object("s/x"), torch.ones(10))


def test_several_pending_snapshots_to_different_paths(tmp_path: Path) -> None:
    pendings = [
        Snapshot.async_take(str(tmp_path / f"snap{i}"), {"s": StateDict(i=i, x=torch.full((100_000,), float(i)))})
        for i in range(3)
    ]
    for i, pending in enumerate(pendings):
        snapshot = pending.wait()
        assert snapshot.read_object("s/i") == i
        assert torch.equal(snapshot.read_object("s/x"), torch.full((100_000,), float(i)))


def test_unknown_executor_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="executor must be one of"):
        Snapshot.async_take(str(tmp_path / "snap"), {"s": StateDict(x=1)}, executor="gpu")


def test_killed_daemon_fails_wait_promptly_and_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_TEST_WRITE_DELAY", "5")
    Snapshot.async_take(str(tmp_path / "warm"), {"s": StateDict(x=1)}, executor="process").wait()
    pid = checkpoint_daemon_pid()
    assert pid is not None
    pending = Snapshot.async_take(f"slow://{tmp_path / 'snap'}", {"s": StateDict(x=torch.ones(10))}, executor="process")
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(CheckpointDaemonError, match=f"daemon \\(pid {pid}\\) exited"):
        pending.wait(timeout=30)
    assert time.monotonic() - started < 10
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(tmp_path / "snap")).metadata
    monkeypatch.setenv("SNAPSHOTKIT_TEST_WRITE_DELAY", "0")
    snapshot = Snapshot.async_take(str(tmp_path / "after"), {"s": StateDict(x=2)}, executor="process").wait()
    assert snapshot.read_object("s/x") == 2
    assert checkpoint_daemon_pid() not in (None, pid)


def _nice_of_tasks(pid: int) -> dict[int, int]:
    """The niceness of every thread of process ``pid`` (field 19 of /proc/<pid>/task/<tid>/stat)."""
    result = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = task.joinpath("stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        result[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return result


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is a Linux feature")
@pytest.mark.parametrize("executor", EXECUTORS)
def test_background_writers_run_at_low_priority_and_the_caller_does_not(tmp_path: Path, executor: str) -> None:
    import threading

    caller = os.getpriority(os.PRIO_PROCESS, 0)  # the default background niceness is 19
    Snapshot.async_take(str(tmp_path / "snap"), _app_state(), executor=executor).wait(timeout=60)
    assert os.getpriority(os.PRIO_PROCESS, 0) == caller  # the caller's thread is untouched
    if executor == "process":
        pid = checkpoint_daemon_pid()
        assert pid is not None
        nice = _nice_of_tasks(pid)
        assert len(nice) > 1 and set(nice.values()) == {max(19, caller)}, nice
    else:
        writers = [t for t in threading.enumerate() if t.name.startswith("snapshotkit-background-19")]
        assert len(writers) >= 2, [t.name for t in threading.enumerate()]  # the loop and its pool
        nice = _nice_of_tasks(os.getpid())
        assert {nice[t.native_id] for t in writers if t.native_id is not None} == {max(19, caller)}
        # The loop that serves synchronous takes and restores keeps the caller's priority.
        others = [t for t in threading.enumerate() if t.name.startswith("snapshotkit-loop")]
        assert others and {nice[t.native_id] for t in others if t.native_id is not None} == {caller}


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_interpreter_exit_with_a_pending_snapshot_finishes_it(tmp_path: Path, executor: str) -> None:
    path = tmp_path / "snap"
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        import _storage_doubles
        _storage_doubles.register()
        from snapshotkit import Snapshot, StateDict
        state = StateDict(**{{f"t{{i}}": torch.full((300_000,), float(i)) for i in range(4)}})
        Snapshot.async_take("slow://{path}", {{"s": state}}, executor={executor!r})
        print("returned", flush=True)
        """
    )
    env = {**os.environ, "SNAPSHOTKIT_TEST_WRITE_DELAY": "0.3", "SNAPSHOTKIT_DATA_OBJECT_BYTES": str(1 << 20)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "returned"
    restored = Snapshot(str(path)).read_object("s")
    assert all(torch.equal(restored[f"t{i}"], torch.full((300_000,), float(i))) for i in range(4))
    assert "leaked" not in done.stderr, done.stderr  # no leaked shared-memory segments


@pytest.mark.slow
def test_interpreter_killed_with_a_pending_snapshot_leaves_nothing_that_opens(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        import _storage_doubles
        _storage_doubles.register()
        from snapshotkit import Snapshot, StateDict
        Snapshot.async_take("slow://{path}", {{"s": StateDict(x=torch.ones(1000))}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "SNAPSHOTKIT_TEST_WRITE_DELAY": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == -signal.SIGKILL
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).metadata


# ------------------------------------------------------------------ many ranks


def _ranked(rank: int, world: int, path: str, executor: str, fail_rank: int) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import _storage_doubles as doubles

    doubles.register()
    state = StateDict(mine=torch.full((200_000,), float(rank)), shared=torch.arange(300_000.0))
    uri = f"failing://{path}" if fail_rank >= 0 else path  # fails on rank fail_rank only
    pending = Snapshot.async_take(uri, {"s": state}, replicated=["s/shared"], executor=executor)
    state["mine"].fill_(-1)
    state["shared"].fill_(-1)
    try:
        pending.wait(timeout=60)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    restored = StateDict(mine=torch.zeros(200_000), shared=torch.zeros(300_000))
    Snapshot(path).restore({"s": restored})
    assert torch.equal(restored["mine"], torch.full((200_000,), float(rank)))
    assert torch.equal(restored["shared"], torch.arange(300_000.0))
    return "ok"


@pytest.mark.slow
@pytest.mark.parametrize(("world", "executor"), [(2, "thread"), (2, "process"), (4, "thread")])
def test_many_ranks_commit_through_the_store(tmp_path: Path, world: int, executor: str) -> None:
    from multirank._harness import run_ranks

    results = run_ranks(world, _ranked, str(tmp_path / "snap"), executor, -1, timeout=120)
    assert results == ["ok"] * world
    manifest = Snapshot(str(tmp_path / "snap")).get_manifest()
    assert manifest["0/s/shared"].replicated  # type: ignore[union-attr]
    assert all(f"{r}/s/mine" in manifest for r in range(world))


def test_one_rank_failing_in_the_background_fails_every_wait(tmp_path: Path) -> None:
    from multirank._harness import run_ranks

    results = run_ranks(
        3, _ranked, str(tmp_path / "snap"), "thread", 1, timeout=120, env={"SNAPSHOTKIT_TEST_FAIL_RANK": "1"}
    )
    assert results[1].startswith("StorageError") and "No space left" in results[1]
    for rank in (0, 2):
        assert results[rank].startswith("RankFailedError: async_take: rank 1 failed"), results[rank]
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(tmp_path / "snap")).metadata


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_background_failure_nobody_waited_for_is_reported_at_exit(tmp_path: Path, executor: str) -> None:
    # Before: an async_take that failed after its caller stopped looking (the interpreter exiting)
    # lost the snapshot without a word.
    path = tmp_path / "snap"
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        import _foreign_storage
        _foreign_storage.register()
        from snapshotkit import Snapshot, StateDict
        from snapshotkit.errors import StorageError
        options = {{"fail": "data-write", "error": "OSError"}}
        seen = Snapshot.async_take("foreign://{path}/seen", {{"s": StateDict(t=torch.ones(1000))}},
                                   storage_options=options, executor={executor!r})
        try:
            seen.wait()
        except StorageError:
            pass
        Snapshot.async_take("foreign://{path}/unseen", {{"s": StateDict(t=torch.ones(1000))}},
                            storage_options=options, executor={executor!r})
        print("returned", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "returned"
    assert f"async_take of foreign://{path}/unseen failed, and no wait() raised it" in done.stderr
    assert "/seen failed" not in done.stderr  # the caller saw that one: not reported again


def test_plugins_registered_after_the_daemon_started_reach_it(tmp_path: Path) -> None:
    """The checkpoint daemon learned plugin registrations only when it started: a scheme
    registered later was unknown to it, and one registered anew kept its old plugin."""
    from snapshotkit.storage import _registry, register_storage_plugin

    state = {"s": StateDict(t=torch.arange(1000.0))}
    Snapshot.async_take(str(tmp_path / "first"), state, executor="process").wait()  # the daemon runs
    try:
        register_storage_plugin("latecomer", _storage_doubles.slow_factory)
        Snapshot.async_take(f"latecomer://{tmp_path / 'second'}", state, executor="process").wait()
        assert len(_storage_doubles.write_times(str(tmp_path / "second"))) == 1  # written by the slow plugin
        register_storage_plugin("latecomer", _storage_doubles.failing_factory)
        with pytest.raises(StorageError, match="injected"):
            Snapshot.async_take(f"latecomer://{tmp_path / 'third'}", state, executor="process").wait()
    finally:
        _registry._registered.pop("latecomer", None)
    assert Snapshot(str(tmp_path / "second")).read_object("s/t").equal(state["s"]["t"])
