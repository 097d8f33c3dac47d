"""One staging budget per process: concurrent ``async_take`` calls share ``memory_budget_bytes``.

Writes are held at a gate (``gated://``, in this process or in the checkpoint daemon) so the
second take is in flight while the first one's data objects are still staged; what staging holds
is read from the process's :class:`~snapshotkit._runtime.staging.StagingBudget` and the writer's
pool, never from RSS or timing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import PendingSnapshot, Snapshot, StateDict
from snapshotkit._runtime.staging import staging_budget
from snapshotkit._take import executors
from snapshotkit.errors import StorageError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _storage_doubles
from _storage_doubles import Gate

_storage_doubles.register()

EXECUTORS = ["thread", "process"]
MIB = 1 << 20
#: 0.75 MiB: each tensor is its own data object, staged in a 1 MiB pooled buffer.
ELEMENTS = 3 * MIB // 16
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def small_objects(
    monkeypatch: pytest.MonkeyPatch, fresh_writers: dict[tuple[str, int], Any]
) -> dict[tuple[str, int], Any]:
    """1 MiB data objects, and fresh background writers (a daemon that knows ``gated://``,
    pools that start empty), stopped afterwards."""
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", str(MIB))
    return fresh_writers


def _state(seed: int, tensors: int = 2, elements: int = ELEMENTS) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {"s": StateDict(**{f"t{i}": torch.randn(elements, generator=gen) for i in range(tensors)})}


def _in_background(calls: list[Callable[[], PendingSnapshot]]) -> tuple[threading.Thread, list[Any]]:
    """Run ``calls`` one after the other on a thread, as a training loop would; their results
    (or the error that stopped them) in order."""
    results: list[Any] = []

    def run() -> None:
        try:
            for call in calls:
                results.append(call())
        except BaseException as exc:
            results.append(exc)

    thread = threading.Thread(target=run, name="test-caller")
    thread.start()
    return thread, results


def _pool_bytes(executor: str) -> int:
    pool = executors.background_writer(executor, 19).pool
    assert pool is not None
    return pool.allocated_bytes


def _check_restores(path: str, state: dict[str, Any]) -> None:
    restored = Snapshot(path).read_object("s")
    for key, tensor in state["s"].items():
        assert torch.equal(restored[key], tensor), key


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_async_takes_in_flight_share_one_budget(tmp_path: Path, executor: str) -> None:
    budget_bytes = 3 * MIB  # two takes of 2 x 0.75 MiB: 2 MiB each as allocated (1 MiB buffers)
    budget = staging_budget()
    budget.resize(budget_bytes)  # what earlier tests pooled does not count here
    budget.reset_peak()
    states = [_state(1), _state(2)]
    paths = [str(tmp_path / "first"), str(tmp_path / "second")]
    with Gate(tmp_path / "gate") as gate:
        options = {"gate": gate.path}

        def take(i: int) -> Callable[[], PendingSnapshot]:
            return lambda: Snapshot.async_take(
                f"gated://{paths[i]}",
                states[i],
                storage_options=options,
                memory_budget_bytes=budget_bytes,
                executor=executor,
            )

        caller, results = _in_background([take(0), take(1)])
        # The first take staged both objects (2 MiB) and returned; the second staged one (3 MiB
        # held) and waits for the first one's writes, which wait at the gate.
        assert budget.wait_for_waiting(1, timeout_s=60), results
        assert len(results) == 1 and isinstance(results[0], PendingSnapshot), results
        assert budget.reserved_bytes == budget_bytes
        assert _pool_bytes(executor) == budget_bytes
        gate.open()
        caller.join()
    assert all(isinstance(r, PendingSnapshot) for r in results), results
    for pending in results:
        pending.wait()
    for path, state in zip(paths, states, strict=True):
        _check_restores(f"gated://{path}", state)
    assert budget.peak_held_bytes <= budget_bytes
    assert budget.reserved_bytes == 0
    assert _pool_bytes(executor) <= budget_bytes  # the pool keeps what fits, no more
    assert budget.held_bytes <= budget_bytes


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_failed_take_gives_its_budget_back_to_the_take_waiting_for_it(tmp_path: Path, executor: str) -> None:
    budget_bytes = 2 * MIB
    staging_budget().resize(budget_bytes)
    states = [_state(3), _state(4)]
    with Gate(tmp_path / "gate") as gate:
        failing = Snapshot.async_take(
            f"gated://{tmp_path / 'fails'}",
            states[0],
            storage_options={"gate": gate.path, "fail": True},
            memory_budget_bytes=budget_bytes,
            executor=executor,
        )
        caller, results = _in_background(
            [
                lambda: Snapshot.async_take(
                    str(tmp_path / "next"), states[1], memory_budget_bytes=budget_bytes, executor=executor
                )
            ]
        )
        assert staging_budget().wait_for_waiting(1, timeout_s=60)  # held by the failing take's writes
        gate.open()
        caller.join()
    with pytest.raises(StorageError, match="No space left on device"):
        failing.wait()
    (pending,) = results
    assert isinstance(pending, PendingSnapshot), pending
    pending.wait()
    _check_restores(str(tmp_path / "next"), states[1])
    assert staging_budget().reserved_bytes == 0


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_object_larger_than_the_budget_runs_alone_after_the_take_in_flight(
    tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(4 * MIB))
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", str(4 * MIB))
    budget_bytes = 2 * MIB
    budget = staging_budget()
    budget.resize(budget_bytes)
    small, large = _state(5, tensors=1), _state(6, tensors=1, elements=3 * MIB // 4)  # 0.75 MiB, 3 MiB
    with Gate(tmp_path / "gate") as gate:
        first = Snapshot.async_take(
            f"gated://{tmp_path / 'small'}",
            small,
            storage_options={"gate": gate.path},
            memory_budget_bytes=budget_bytes,
            executor=executor,
        )
        caller, results = _in_background(
            [
                lambda: Snapshot.async_take(
                    str(tmp_path / "large"), large, memory_budget_bytes=budget_bytes, executor=executor
                )
            ]
        )
        assert budget.wait_for_waiting(1, timeout_s=60)  # 1 MiB + 4 MiB > 2 MiB: it waits
        gate.open()
        caller.join()
    first.wait()
    (pending,) = results
    assert isinstance(pending, PendingSnapshot), pending
    pending.wait()
    _check_restores(f"gated://{tmp_path / 'small'}", small)
    _check_restores(str(tmp_path / "large"), large)
    assert _pool_bytes(executor) <= budget_bytes  # the 4 MiB buffer was freed once written
    assert budget.held_bytes <= budget_bytes
