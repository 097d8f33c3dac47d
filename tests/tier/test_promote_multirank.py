"""Promotion on 4 real gloo ranks playing 2 nodes: the durable step promoted from the local copies
holds what a take from memory holds (replicated entries written once), an incremental promotion
writes only what changed, a state with DTensors is taken from memory instead
(tests/tier/test_sharded_multirank.py has the same on 4 ranks, with an FSDP2 model), and a rank
killed in a promotion leaves the previous durable step and the local copies."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from multirank._harness import run_ranks

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit._format.entries import ObjectEntry, PrimitiveEntry, TensorEntry
from tier._promotions import Promotions

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

WORLD = 4


def _manager(rank: int, tmp: str, **kwargs: Any) -> SnapshotManager:
    node = "A" if rank < 2 else "B"
    os.environ["SNAPSHOTKIT_NODE_ID"] = node
    options: dict[str, Any] = {"local_replicas": 1, "preemption_signals": (), "async_executor": None}
    return SnapshotManager(
        f"{tmp}/durable",
        save_interval_steps=2,
        local_root=f"{tmp}/local/{node}",
        local_interval_steps=1,
        **{**options, **kwargs},
    )


def _described(manifest: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, entry in manifest.items():
        if isinstance(entry, TensorEntry):
            out[key] = (entry.dtype, entry.shape, entry.replicated, [p.checksum for p in entry.pieces])
        elif isinstance(entry, ObjectEntry):
            out[key] = (entry.obj_type, entry.replicated, entry.piece.checksum)
        elif isinstance(entry, PrimitiveEntry):
            out[key] = (entry.value_type, entry.value, entry.replicated)
        else:
            out[key] = entry
    return out


def _state(rank: int) -> dict[str, Any]:
    own = StateDict(w=torch.arange(1 << 16, dtype=torch.float32) * (rank + 1), step=0, tag={"rank": rank})
    shared = StateDict(table=torch.linspace(0, 1, 1 << 16), lr=0.5)  # the same on every rank
    return {"own": own, "shared": shared}


def _promote_and_compare(rank: int, world: int, tmp: str) -> dict[str, Any]:
    handler = Promotions()
    mgr = _manager(rank, tmp, incremental=True)
    app = _state(rank)
    for step in (1, 2, 3, 4):
        app["own"]["w"][:1024] += 0.25  # the first 4 KiB of each rank's tensor change
        app["own"]["step"] = step
        mgr.save(step, app, async_take=True, replicated=["shared/**"])
        mgr.wait()
    promoted = mgr.snapshot(4)
    from_memory = Snapshot.take(f"{tmp}/memory", app, replicated=["shared/**"])
    same = _described(promoted.metadata.manifest) == _described(from_memory.metadata.manifest)
    own_bytes = sum(
        p.nbytes
        for e in promoted.metadata.manifest.values()
        if isinstance(e, TensorEntry)
        for p in e.pieces
        if p.base is None
    )
    fresh = _state(rank)
    fresh["own"]["w"].zero_()
    fresh["shared"]["table"].zero_()
    Snapshot(promoted.path).restore(fresh)
    exact = all(torch.equal(fresh[k][n], app[k][n]) for k, n in (("own", "w"), ("shared", "table")))
    exact = exact and fresh["own"]["step"] == 4
    mgr.close()
    return {"promotions": handler.count, "same": same, "own_bytes": own_bytes, "exact": exact}


def test_promoted_steps_match_a_take_from_memory_on_every_rank(tmp_path: Path) -> None:
    results = run_ranks(WORLD, _promote_and_compare, str(tmp_path))
    for result in results:
        assert result["promotions"] == 2 and result["same"] and result["exact"]
    # step 4 wrote only each rank's changed tensor (its chunk of 256 KiB holding the change)
    assert all(r["own_bytes"] == WORLD * (1 << 18) for r in results)  # the manifest is every rank's


def _dtensor_state(rank: int, world: int, tmp: str) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    handler = Promotions()
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    mgr = _manager(rank, tmp, local_replicas=0)
    mgr.save(2, {"m": StateDict(w=distribute_tensor(full, mesh, [Shard(0)]), step=2)}, async_take=True)
    mgr.wait()
    blank = {"m": StateDict(w=distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]), step=0)}
    mgr.snapshot(2).restore(blank)
    exact = torch.equal(blank["m"]["w"].full_tensor(), full)
    mgr.close()
    return {"promotions": handler.count, "exact": exact}


def test_a_state_with_dtensors_is_taken_from_memory(tmp_path: Path) -> None:
    """One rank: its local copy holds the DTensor's local tensor, and a durable take needs the live one."""
    assert run_ranks(1, _dtensor_state, str(tmp_path)) == [{"promotions": 0, "exact": True}]


def _die_in_a_promotion(rank: int, world: int, tmp: str, victim: int) -> str:
    """Saves steps 1-4 (2 and 4 promoted); rank ``victim`` SIGKILLs itself in the promotion of
    step 4, once its part of the durable take is staged (before the commit)."""
    import signal

    from snapshotkit import events

    def kill_in_the_promotion(event: events.Event) -> None:
        if event.kind == "take_staged" and event.path.endswith("durable/step_4"):
            os.kill(os.getpid(), signal.SIGKILL)

    if rank == victim:
        events.subscribe(kill_in_the_promotion)
    mgr = _manager(rank, tmp)
    app = _state(rank)
    try:
        for step in (1, 2, 3, 4):
            app["own"]["w"] += 1.0
            app["own"]["step"] = step
            mgr.save(step, app, async_take=True, replicated=["shared/**"])
        mgr.wait()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _after_the_kill(rank: int, world: int, tmp: str) -> dict[str, Any]:
    mgr = _manager(rank, tmp)
    durable = mgr.steps()
    app = _state(rank)
    app["own"]["w"].zero_()
    step = mgr.restore_latest(app)
    want = _state(rank)["own"]["w"] + 4.0
    exact_local = torch.equal(app["own"]["w"], want) and app["own"]["step"] == 4
    older = _state(rank)
    older["own"]["w"].zero_()
    mgr.snapshot(2).restore(older)
    exact_durable = torch.equal(older["own"]["w"], _state(rank)["own"]["w"] + 2.0)
    report = mgr.last_restore_report
    mgr.close()
    return {
        "durable": durable,
        "step": step,
        "source": report.source if report else None,
        "exact": exact_local and exact_durable,
    }


def test_kill_9_during_a_promotion_leaves_the_previous_durable_step_and_the_local_copies(tmp_path: Path) -> None:
    outcome = run_ranks(
        WORLD,
        _die_in_a_promotion,
        str(tmp_path),
        1,
        missing_ok=True,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "10"},
    )
    assert outcome[1] is None, outcome  # killed
    survivors = [o.split(":")[0] for o in outcome[:1] + outcome[2:]]
    assert set(survivors) <= {"CollectiveTimeoutError", "RankFailedError"}, outcome
    assert not (tmp_path / "durable" / "step_4" / ".snapshot_metadata").exists()  # never committed
    results = run_ranks(WORLD, _after_the_kill, str(tmp_path))
    for result in results:
        # the durable tier has step 2 (step 4's leftovers removed); step 4 comes from the local copies
        assert result == {"durable": [2], "step": 4, "source": "local", "exact": True}, results
    assert not (tmp_path / "durable" / "step_4").exists()
