"""The fast-recovery tier end to end: 4 real gloo ranks playing 2 nodes (ranks 0-1 on node A,
ranks 2-3 on node B, each node with its own local root), a durable root shared by all.

A "run" trains a tiny per-rank state for some steps under a SnapshotManager, saving to the local
tier every 2 steps and to the durable tier every 4; then the processes end without closing the
manager (every rank "killed"). The tests damage what a lost node or a bad disk would, restart,
and check which step every rank restored, from which tier, bit for bit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from multirank._harness import run_ranks

from snapshotkit import SnapshotManager, StateDict

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

WORLD = 4


def _node(rank: int) -> str:
    return "A" if rank < 2 else "B"


def _expected(rank: int, step: int) -> torch.Tensor:
    """The state of ``rank`` after ``step`` training steps (as _train computes it)."""
    w = torch.arange(64, dtype=torch.float32) * (rank + 1)
    for s in range(1, step + 1):
        w = w * 1.5 + s
    return w


def _manager(rank: int, root: str, locals_: str, replicas: int) -> SnapshotManager:
    os.environ["SNAPSHOTKIT_NODE_ID"] = _node(rank)
    return SnapshotManager(
        root,
        save_interval_steps=4,
        keep_last=3,
        local_root=str(Path(locals_) / _node(rank)),
        local_interval_steps=2,
        local_keep_last=2,
        local_replicas=replicas,
        preemption_signals=(),
        async_executor=None,
    )


def _train(rank: int, world: int, root: str, locals_: str, replicas: int, steps: int, async_take: bool) -> list[int]:
    """Run 1: train ``steps`` steps saving on both tiers; end without closing (killed)."""
    mgr = _manager(rank, root, locals_, replicas)
    state = StateDict(w=torch.arange(64, dtype=torch.float32) * (rank + 1), step=0)
    saved = []
    for step in range(1, steps + 1):
        state["w"] = state["w"] * 1.5 + step
        state["step"] = step
        if mgr.should_save(step):
            mgr.save(step, {"s": state}, async_take=async_take)
            saved.append(step)
    mgr.wait()  # the replicas are made; then the process just ends
    return saved


def _resume(rank: int, world: int, root: str, locals_: str, replicas: int) -> dict[str, Any]:
    mgr = _manager(rank, root, locals_, replicas)
    state = StateDict(w=torch.zeros(64), step=-1)
    step = mgr.restore_latest({"s": state})
    report = mgr.last_restore_report
    result = {
        "step": step,
        "exact": step is not None and torch.equal(state["w"], _expected(rank, step)) and state["step"] == step,
        "source": None if report is None else report.source,
    }
    # the run goes on saving to every tier
    state["w"] = state["w"] * 1.5 + (step or 0) + 1
    next_step = (step or 0) + 1
    while not mgr.should_save(next_step):
        next_step += 1
    mgr.save(next_step, {"s": state})
    mgr.close()
    result["own_local_steps"] = sorted(
        int(p.parent.parent.name.removeprefix("step_"))
        for p in (Path(locals_) / _node(rank)).glob(f"step_*/rank_{rank}/.snapshot_metadata")
    )
    return result


def _drop_durable_data(root: Path) -> None:
    """Delete every data object of the durable root (manifests stay): a restore that reads one fails."""
    for data in root.glob("step_*/data"):
        shutil.rmtree(data)


@pytest.mark.parametrize("async_take", [False, True])
def test_lost_node_restores_newest_local_step_from_peers(tmp_path: Path, async_take: bool) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    saved = run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, async_take)
    assert saved[0] == [2, 4, 6]
    shutil.rmtree(locals_ / "B")  # node B is replaced: its local disk is empty
    _drop_durable_data(root)  # proves no data object is read from the durable tier
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 1)
    assert [r["step"] for r in results] == [6] * WORLD
    assert all(r["exact"] for r in results)
    assert [r["source"] for r in results] == ["local", "local", "peer", "peer"]
    for rank, r in enumerate(results):  # the replaced node holds its ranks' copies again, and the next save
        assert 6 in r["own_local_steps"] and 8 in r["own_local_steps"], (rank, r)


def test_lost_node_without_replicas_falls_back_to_the_durable_step(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 0, 7, False)
    shutil.rmtree(locals_ / "B")
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 0)
    assert [r["step"] for r in results] == [4] * WORLD
    assert all(r["exact"] for r in results)
    assert [r["source"] for r in results] == ["durable"] * WORLD


def _flip_a_byte(copy: Path) -> None:
    data = sorted(p for p in (copy / "data").rglob("*") if p.is_file())
    target = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    target.write_bytes(bytes(raw))


def test_a_damaged_local_copy_is_never_used(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, False)
    _flip_a_byte(locals_ / "A" / "step_6" / "rank_0")  # rank 0's own copy; its replica on node B is intact
    _drop_durable_data(root)
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 1)
    assert [r["step"] for r in results] == [6] * WORLD
    assert all(r["exact"] for r in results)
    assert results[0]["source"] == "peer"
    assert [r["source"] for r in results[1:]] == ["local"] * 3


def test_damaged_copy_and_its_replica_fall_back_to_an_older_intact_step(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, False)
    _flip_a_byte(locals_ / "A" / "step_6" / "rank_0")
    _flip_a_byte(locals_ / "B" / "step_6" / "rank_0")  # the replica too: step 6 cannot be served to rank 0
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 1)
    assert [r["step"] for r in results] == [4] * WORLD
    assert all(r["exact"] for r in results)
    assert {r["source"] for r in results} <= {"local", "peer", "durable"}


def _resume_with_a_replica_damaged_in_transit(rank: int, world: int, root: str, locals_: str) -> dict[str, Any]:
    """Run 2 on a replaced node B: the first data chunk of the first replica rank 2 receives has
    one bit flipped between the peer's disk and rank 2's."""
    if rank == 2:
        from snapshotkit._dist import Group

        original = Group.receive_from
        flipped = []

        def flipping(self: Group, tensor: Any, peer: int, what: str) -> None:
            original(self, tensor, peer, what)
            # a body chunk (in the transfer's 16 MiB buffer) after the manifest's (which starts '{')
            if not flipped and tensor.untyped_storage().nbytes() == 16 << 20 and tensor[0] != ord("{"):
                tensor[-1] ^= 0x01
                flipped.append(what)

        Group.receive_from = flipping  # type: ignore[method-assign]
    return _resume(rank, world, root, locals_, 1)


def test_a_replica_damaged_in_transit_is_never_used(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, False)
    shutil.rmtree(locals_ / "B")
    _drop_durable_data(root)  # only the local tier can serve: step 4, the older replicas
    results = run_ranks(WORLD, _resume_with_a_replica_damaged_in_transit, str(root), str(locals_))
    assert [r["step"] for r in results] == [4] * WORLD
    assert all(r["exact"] for r in results)
    assert [r["source"] for r in results] == ["local", "local", "peer", "peer"]
    assert not [p for p in locals_.rglob("*") if ".incoming-" in p.name]


def _resume_then_die_in_a_local_save(rank: int, world: int, root: str, locals_: str, victim: int) -> str:
    """Run 2: resume, train on to step 8, and on rank ``victim`` SIGKILL the process in the middle
    of the local save of step 8 (after staging, before the copy commits)."""
    import signal

    from snapshotkit import events

    mgr = _manager(rank, root, locals_, 1)
    state = StateDict(w=torch.zeros(64), step=-1)
    step = mgr.restore_latest({"s": state})
    assert step == 6

    def kill_in_the_save(event: events.Event) -> None:
        if event.kind == "take_staged" and event.path.endswith(f"step_8/rank_{rank}"):
            os.kill(os.getpid(), signal.SIGKILL)

    if rank == victim:
        events.subscribe(kill_in_the_save)
    return _train_to_step_8(mgr, state)  # step 8 is a durable step too: the victim never joins it


def _train_to_step_8(mgr: SnapshotManager, state: StateDict) -> str:
    """Steps 7 and 8 after a resume at 6, saving where due; the error this rank ended with."""
    try:
        for step in (7, 8):
            state["w"] = state["w"] * 1.5 + step
            state["step"] = step
            if mgr.should_save(step):
                mgr.save(step, {"s": state})
        mgr.wait()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_kill_9_during_a_local_save_leaves_the_previous_step_restorable(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, False)
    outcome = run_ranks(
        WORLD,
        _resume_then_die_in_a_local_save,
        str(root),
        str(locals_),
        2,
        missing_ok=True,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "10"},
    )
    assert outcome[2] is None  # killed
    survivors = [o.split(":")[0] for o in outcome[:2] + outcome[3:]]
    assert set(survivors) <= {"CollectiveTimeoutError", "RankFailedError"}, outcome
    victim_copy = locals_ / "B" / "step_8" / "rank_2"
    assert victim_copy.exists() and not (victim_copy / ".snapshot_metadata").exists()  # cut short
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 1)
    # rank 2 has no copy of step 8 and nobody holds one for it: step 6, intact everywhere
    assert [r["step"] for r in results] == [6] * WORLD
    assert all(r["exact"] for r in results)
    assert [r["source"] for r in results] == ["local"] * WORLD
    assert all(8 in r["own_local_steps"] for r in results)  # saved again, committed this time


def _resume_then_die_receiving_a_replica(rank: int, world: int, root: str, locals_: str, victim: int) -> str:
    """Run 2: resume, train to step 8; rank ``victim`` SIGKILLs itself in the middle of
    receiving a peer's replica of step 8 (after the first bytes are written)."""
    import signal

    from snapshotkit._tier import receive

    mgr = _manager(rank, root, locals_, 1)
    state = StateDict(w=torch.zeros(64), step=-1)
    assert mgr.restore_latest({"s": state}) == 6
    if rank == victim:
        write = receive._write_chunk

        def write_then_die(fd: int, data: memoryview, offset: int, path: Path) -> str:
            if "step_8" in str(path):
                write(fd, data[: len(data) // 2], offset, path)
                os.kill(os.getpid(), signal.SIGKILL)
            return write(fd, data, offset, path)

        receive._write_chunk = write_then_die  # type: ignore[assignment]
    return _train_to_step_8(mgr, state)


def test_kill_9_during_a_replica_transfer_leaves_the_steps_restorable(tmp_path: Path) -> None:
    root, locals_ = tmp_path / "durable", tmp_path / "local"
    run_ranks(WORLD, _train, str(root), str(locals_), 1, 7, False)
    outcome = run_ranks(
        WORLD,
        _resume_then_die_receiving_a_replica,
        str(root),
        str(locals_),
        0,
        missing_ok=True,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "10"},
    )
    assert outcome[0] is None  # killed while receiving
    assert {o.split(":")[0] for o in outcome[1:]} <= {"CollectiveTimeoutError", "RankFailedError", "no error"}, outcome
    assert list((locals_ / "A" / "step_8").glob("rank_*.incoming-*"))  # what the receiver left
    results = run_ranks(WORLD, _resume, str(root), str(locals_), 1)
    # every rank's own copy of step 8 committed before the replication: step 8, each from its own
    assert [r["step"] for r in results] == [8] * WORLD
    assert all(r["exact"] for r in results)
    assert [r["source"] for r in results] == ["local"] * WORLD
    assert not list((locals_ / "A" / "step_8").glob("rank_*.incoming-*"))  # removed by the next manager
