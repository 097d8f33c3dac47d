"""``SnapshotManager.should_save`` with real gloo ranks: a preemption notice on one rank makes every
rank save at the same step, agreed through the process group's store every
``preemption_check_every`` calls, with no collective and no store key left behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import SnapshotManager, StateDict

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _store_keys() -> int:
    """Keys in the default store, once every rank got here (so no rank is mid-round)."""
    import torch.distributed as dist

    dist.barrier()
    count = int(dist.distributed_c10d._get_default_store().num_keys())
    dist.barrier()  # no rank starts a round before every rank counted
    return count


def _quiet_then_notice(rank: int, world: int, root: str, notice_step: int, by_signal: bool) -> dict[str, Any]:
    keys_before = _store_keys()
    mgr = SnapshotManager(root, preemption_signals=(signal.SIGUSR1,), async_executor=None)
    group = mgr._group
    collectives = group.collectives
    quiet = [mgr.should_save(step) for step in range(1, 101)]  # nothing to save: no interval, no notice
    quiet_counts = {"collectives": group.collectives - collectives, "store_rounds": group.store_rounds}
    keys_after_quiet = _store_keys()
    agreed_at = None
    for step in range(101, 160):
        if rank == world - 1 and step == notice_step:
            if by_signal:
                os.kill(os.getpid(), signal.SIGUSR1)
            else:
                mgr.request_preemption()
        if mgr.should_save(step):
            agreed_at = step
            mgr.save(step, {"s": StateDict(rank=rank, step=step)})
            break
    after_save = [mgr.should_save(step) for step in range(agreed_at or 0, (agreed_at or 0) + 25)]
    received, saved = mgr.preemption_received, mgr.preemption_saved
    mgr.close()
    return {
        "quiet": quiet,
        "quiet_counts": quiet_counts,
        "keys": (keys_before, keys_after_quiet, _store_keys()),
        "agreed_at": agreed_at,
        "after_save": after_save,
        "received_saved": (received, saved),
        "steps": SnapshotManager(root, preemption_signals=(), async_executor=None).steps(),
    }


@pytest.mark.parametrize(("world", "by_signal"), [(2, False), (3, False), (2, True)])
def test_a_notice_on_one_rank_saves_every_rank_at_the_same_step(tmp_path: Path, world: int, by_signal: bool) -> None:
    results = run_ranks(world, _quiet_then_notice, str(tmp_path / "run"), 107, by_signal, timeout=200)
    for result in results:
        # 100 calls with nothing to save: 10 rounds through the store (calls 0, 10, ... 90), no collective
        assert result["quiet"] == [False] * 100
        assert result["quiet_counts"] == {"collectives": 0, "store_rounds": 10}
        # every round deleted its keys: the store holds what it held before the manager
        before, after_quiet, after_all = result["keys"]
        assert before == after_quiet == after_all
        # the notice arrived before the call of step 107 (call 106); the next round is call 110,
        # step 111: at most preemption_check_every calls later, on every rank alike
        assert result["agreed_at"] == 111
        assert result["after_save"] == [False] * 25  # saved for it; the step has a snapshot
        assert result["received_saved"] == (True, True)
        assert result["steps"] == [111]


def _stop_calling(rank: int, world: int, root: str) -> str:
    import torch.distributed as dist

    mgr = SnapshotManager(root, preemption_signals=(), async_executor=None, preemption_check_every=5)
    outcome = "no error"
    try:
        # rank 1 stops after 5 calls; rank 0's round at call 5 (step 6) finds nobody
        for step in range(1, 11 if rank == 0 else 6):
            mgr.should_save(step)
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    mgr.close()
    return outcome


def test_a_rank_that_stops_calling_is_a_timeout_naming_the_step_not_a_hang(tmp_path: Path) -> None:
    results = run_ranks(
        2, _stop_calling, str(tmp_path / "run"), timeout=120, env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "2"}
    )
    assert results[1] == "no error"
    assert results[0].startswith(
        "CollectiveTimeoutError: SnapshotManager.should_save(step=6): agreeing on a preemption notice: rank 0 of 2 "
        "waited 2 s for the other ranks"
    )
    assert "SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS" in results[0]


def _commit_waiting() -> bool:
    """Whether a thread of this process is in the store wait of an ``async_take``'s commit."""
    return any(
        frame.f_code.co_name == "_wait" and frame.f_code.co_filename.endswith("rendezvous.py")
        for frame in sys._current_frames().values()
    )


def _rounds_while_a_commit_waits(rank: int, world: int, root: str, gate_path: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
    import _storage_doubles

    _storage_doubles.register()
    keys_before = _store_keys()
    state = {"s": StateDict(rank=rank, t=torch.full((1000,), float(rank)))}
    # rank 1's data writes wait at a gate it holds closed: rank 0's background commit sits in a
    # store wait for rank 1's result while both main threads run should_save rounds
    gate = _storage_doubles.Gate(Path(gate_path)).__enter__() if rank == 1 else None
    options = {"gate": gate_path if rank == 1 else None}
    mgr = SnapshotManager(
        f"gated://{root}",
        preemption_signals=(),
        async_executor="thread",
        preemption_check_every=1,
        storage_options=options,
    )
    pending = mgr.save(1, state, async_take=True)
    if rank == 0:  # its commit sets its result, then waits on the store for rank 1's
        deadline = time.monotonic() + 60
        while not _commit_waiting():
            assert time.monotonic() < deadline, "rank 0's commit never reached its store wait"
            time.sleep(0.001)
    answers = {}
    for step in range(2, 8):
        if rank == 0 and step == 5:
            mgr.request_preemption()
        answers[step] = mgr.should_save(step)
    still_pending = not pending.done()  # the commit was in flight through every round
    # ... and its wait was left alone: on the shared store connection, a round's operations would
    # end it early (measured with torch 2.13) or queue behind it until it times out
    undisturbed = _commit_waiting() if rank == 0 else True
    if gate is not None:
        gate.__exit__()
    mgr.save(7, state)  # the notice's save: waits for the pending one first
    rounds = mgr._group.store_rounds
    mgr.close()
    return {
        "true_at": [s for s, v in answers.items() if v],
        "still_pending": still_pending,
        "undisturbed": undisturbed,
        "rounds": rounds,
        "keys": (keys_before, _store_keys()),
        "steps": SnapshotManager(root, preemption_signals=(), async_executor=None).steps(),
    }


def test_rounds_run_while_an_async_take_commit_waits_on_the_store(tmp_path: Path) -> None:
    results = run_ranks(
        2,
        _rounds_while_a_commit_waits,
        str(tmp_path / "run"),
        str(tmp_path / "gate"),
        timeout=200,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "10"},
    )
    for result in results:
        assert result["still_pending"] is True
        assert result["undisturbed"] is True
        assert result["true_at"] == [5, 6, 7]  # check_every=1: the very call after the notice, until saved
        assert result["rounds"] == 4  # steps 2-5; agreed from then on, no more rounds
        assert result["keys"][0] == result["keys"][1]
        assert result["steps"] == [1, 7]
