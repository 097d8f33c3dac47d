"""The local tier with sharded state on 4 real gloo ranks playing 2 nodes: an FSDP2 model and its
optimizer (``DTensor`` parameters and moments), and a plain ``DTensor``. Each rank's local copy
holds its own shards; a lost node's ranks get theirs back from the peers, bit for bit, into the
same layout; the durable step is taken from memory (never promoted); a state whose shards sit
elsewhere is refused before anything is read."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from multirank._fsdp import fsdp_model, train_step
from multirank._harness import run_ranks

from snapshotkit import SnapshotManager, StateDict
from tier._promotions import Promotions

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

WORLD = 4


def _manager(rank: int, tmp: str) -> SnapshotManager:
    node = "A" if rank < 2 else "B"
    os.environ["SNAPSHOTKIT_NODE_ID"] = node
    return SnapshotManager(
        f"{tmp}/durable",
        save_interval_steps=2,
        local_root=f"{tmp}/local/{node}",
        local_interval_steps=1,
        local_replicas=1,
        preemption_signals=(),
        async_executor=None,
    )


def _local_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter and moment this rank holds, as local tensors (cloned)."""
    out = [p.to_local().clone() for p in model.parameters()]  # type: ignore[operator]
    for state in torch.optim.Optimizer.state_dict(optim)["state"].values():
        out += [v.to_local().clone() if hasattr(v, "to_local") else v.clone() for v in state.values()]
    return out


def _dtensor(world: int, value: float, placement: str = "S0") -> Any:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    full = torch.arange(64 * world, dtype=torch.float32).reshape(8 * world, 8) + value
    return distribute_tensor(full, mesh, [Shard(0 if placement == "S0" else 1)])


def _train(rank: int, world: int, tmp: str) -> dict[str, Any]:
    handler = Promotions()
    model, optim = fsdp_model(seed=0)
    mgr = _manager(rank, tmp)
    saved: list[torch.Tensor] = []
    for step in (1, 2, 3):  # 2: both tiers; 1 and 3: local only
        train_step(model, optim, seed=step)
        app = {"model": model, "optim": optim, "extra": StateDict(w=_dtensor(world, step), step=step)}
        mgr.save(step, app, async_take=True)
        mgr.wait()
        saved = _local_state(model, optim)
    torch.save(saved, f"{tmp}/expected_{rank}.pt")
    return {"promotions": handler.count}  # then "killed": no close


def _resume(rank: int, world: int, tmp: str, placement: str, fresh: bool = False) -> dict[str, Any]:
    model, optim = fsdp_model(seed=42)
    if not fresh:
        train_step(model, optim, seed=7)  # optimizer state (DTensor moments) to restore into
    app = {"model": model, "optim": optim, "extra": StateDict(w=_dtensor(world, -1.0, placement), step=0)}
    mgr = _manager(rank, tmp)
    try:
        step = mgr.restore_latest(app)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    report = mgr.last_restore_report
    expected = torch.load(f"{tmp}/expected_{rank}.pt")
    exact = all(torch.equal(a, b) for a, b in zip(_local_state(model, optim), expected, strict=True))
    want = _dtensor(world, 3).full_tensor()
    exact = exact and torch.equal(app["extra"]["w"].full_tensor(), want) and app["extra"]["step"] == 3
    train_step(model, optim, seed=8)  # still a working model and optimizer
    mgr.close()
    return {"step": step, "exact": exact, "source": report.source if report else None}


def test_fsdp2_state_comes_back_from_the_peers_bit_exact(tmp_path: Path) -> None:
    assert run_ranks(WORLD, _train, str(tmp_path)) == [{"promotions": 0}] * WORLD  # sharded: from memory
    shutil.rmtree(tmp_path / "local" / "B")  # node B is replaced
    results = run_ranks(WORLD, _resume, str(tmp_path), "S0")
    assert [r.get("source") for r in results] == ["local", "local", "peer", "peer"], results
    assert all(r["step"] == 3 and r["exact"] for r in results), results


def test_a_fresh_fsdp2_optimizer_is_restored_from_the_peers(tmp_path: Path) -> None:
    """As a resumed run builds it: no optimizer state yet. Its moments come back as DTensors."""
    run_ranks(WORLD, _train, str(tmp_path))
    shutil.rmtree(tmp_path / "local" / "B")
    results = run_ranks(WORLD, _resume, str(tmp_path), "S0", True)
    assert [r.get("source") for r in results] == ["local", "local", "peer", "peer"], results
    assert all(r["step"] == 3 and r["exact"] for r in results), results


def test_shards_in_another_layout_are_refused(tmp_path: Path) -> None:
    run_ranks(WORLD, _train, str(tmp_path))
    results = run_ranks(WORLD, _resume, str(tmp_path), "S1")  # the DTensor now sharded along dim 1
    for result in results:
        assert "error" in result, result
    # the rank that found it names the path and says what to do; the others name that rank
    assert any("'extra/w'" in r["error"] and "durable tier" in r["error"] for r in results), results
