"""A take (issue 24) or restore (issue 27) of many small tensors runs with the cyclic garbage collector paused.

With the collector running, a take of 20,000 small tensors made about ten middle-generation
collections, enough to start a full collection of the process in most takes (0.1-0.2 s of a
~0.4 s take). The tests lower the thresholds so that a take of a few thousand tensors would
collect dozens of times, and count the collections that run while the caller is in the take.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._runtime.gc import gc_paused

pytestmark = pytest.mark.usefixtures("clean_env")

COUNT = 3000


@pytest.fixture
def collections(tmp_path: Path) -> Iterator[list[tuple[int, int]]]:
    """(thread id, generation) of every collection from here to the end of the test, with
    thresholds low enough that an unpaused take collects many times. A take of another
    structure runs first, so that what the first take imports (psutil...) is not counted."""
    Snapshot.take(str(tmp_path / "warm-up"), {"m": StateDict(x=torch.zeros(1))})
    found: list[tuple[int, int]] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            found.append((threading.get_ident(), info["generation"]))

    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.enable()
    gc.set_threshold(50, 2, 2)
    gc.callbacks.append(record)
    try:
        yield found
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()


def _state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    return {"m": StateDict({f"p{i:05d}": torch.rand(16, generator=generator) for i in range(COUNT)})}


def test_a_take_collects_no_garbage_while_it_runs(tmp_path: Path, collections: list[tuple[int, int]]) -> None:
    state = _state()
    gc.collect()  # the young count at 0: a collection started just before the pause is not the take's
    collections.clear()
    Snapshot.take(str(tmp_path / "snap"), state)
    # At most the one young collection that the first allocation after the pause starts.
    assert len(collections) <= 1, collections
    assert gc.isenabled()
    restored = {"m": StateDict({key: torch.zeros(16) for key in state["m"]})}
    Snapshot(str(tmp_path / "snap")).restore(restored)
    assert all(torch.equal(restored["m"][key], value) for key, value in state["m"].items())


def test_a_restore_collects_no_garbage_while_it_runs(tmp_path: Path, collections: list[tuple[int, int]]) -> None:
    state = _state()
    Snapshot.take(str(tmp_path / "snap"), state)
    Snapshot(str(tmp_path / "snap")).restore({"m": StateDict(x=torch.zeros(1))}, strict=False)  # imports, warm
    restored = {"m": StateDict({key: torch.zeros(16) for key in state["m"]})}
    gc.collect()  # the young count at 0: a collection started just before the pause is not the take's
    collections.clear()
    Snapshot(str(tmp_path / "snap")).restore(restored)
    # Planning, reading and load_state_dict() alike: at most the young collection after the pause.
    assert len(collections) <= 1, collections
    assert gc.isenabled()
    assert all(torch.equal(restored["m"][key], value) for key, value in state["m"].items())


def test_a_repeated_take_reusing_its_plan_collects_no_garbage(
    tmp_path: Path, collections: list[tuple[int, int]]
) -> None:
    state = _state()
    Snapshot.take(str(tmp_path / "first"), state)
    gc.collect()  # the young count at 0: a collection started just before the pause is not the take's
    collections.clear()
    Snapshot.take(str(tmp_path / "again"), state)
    assert len(collections) <= 1, collections


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_async_take_collects_no_garbage_while_the_caller_is_blocked(
    tmp_path: Path, collections: list[tuple[int, int]], executor: str
) -> None:
    state = _state()
    # The executor's first use starts its threads (or daemon): not what is counted here.
    Snapshot.async_take(str(tmp_path / "warm-up-async"), {"m": StateDict(x=torch.zeros(1))}, executor=executor).wait()
    caller = threading.get_ident()
    gc.collect()  # the young count at 0: a collection started just before the pause is not the take's
    collections.clear()
    pending = Snapshot.async_take(str(tmp_path / "snap"), state, executor=executor)
    on_caller = [generation for thread, generation in collections if thread == caller]
    pending.wait()
    assert len(on_caller) <= 1, on_caller
    assert gc.isenabled()


def test_pauses_nest_and_overlap_across_threads() -> None:
    assert gc.isenabled()
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            entered.set()
            leave.wait()

    thread = threading.Thread(target=other)
    try:
        with gc_paused():
            assert not gc.isenabled()
            thread.start()
            entered.wait()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other thread's pause is still on
    finally:
        leave.set()
        thread.join()
    assert gc.isenabled()


def test_a_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python >= 3.12
def test_a_process_forked_during_a_pause_collects_again() -> None:
    read, write = os.pipe()
    with gc_paused():
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's cleanups
            os.write(write, b"1" if gc.isenabled() else b"0")
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"1"
    assert gc.isenabled()
