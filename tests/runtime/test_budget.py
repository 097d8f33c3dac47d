from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from plan._layouts import plan_layout

from snapshotkit import Snapshot, StateDict
from snapshotkit._plan.leaves import Payload
from snapshotkit._restore.fetch import read_pieces
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import rank_view
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._take.stage import staging_cost_bytes
from snapshotkit.storage import FSStoragePlugin


def test_reservations_wait_until_they_fit() -> None:
    async def scenario() -> list[str]:
        budget = MemoryBudget(100)
        events: list[str] = []
        await budget.acquire(60)

        async def second() -> None:
            await budget.acquire(50)  # must wait: 60 + 50 > 100
            events.append("second acquired")
            await budget.release(50)

        task = asyncio.ensure_future(second())
        await asyncio.sleep(0)
        events.append("first releasing")
        await budget.release(60)
        await task
        assert budget.reserved_bytes == 0
        assert budget.peak_reserved_bytes <= 100
        return events

    assert asyncio.run(scenario()) == ["first releasing", "second acquired"]


def test_oversized_reservation_runs_alone() -> None:
    async def scenario() -> int:
        budget = MemoryBudget(10)
        await budget.acquire(1000)  # nothing else reserved: allowed
        blocked = asyncio.ensure_future(budget.acquire(1))
        await asyncio.sleep(0)
        assert not blocked.done()
        await budget.release(1000)
        await blocked
        return budget.peak_reserved_bytes

    assert asyncio.run(scenario()) == 1000


def test_zero_copy_payloads_cost_nothing_to_stage() -> None:
    contiguous = torch.ones(1000)
    strided = torch.ones(100, 10).t()
    payloads = [Payload.of_tensor(contiguous), Payload.of_tensor(strided), Payload.of_bytes(b"x" * 10)]
    objects, _ = plan_layout(
        [p.nbytes for p in payloads], [4, 4, 1], rank=0, take_id="t", chunk_bytes=1 << 20, data_object_bytes=1 << 20
    )
    (plan,) = objects
    assert staging_cost_bytes(plan, payloads) == strided.numel() * 4


def test_strided_restore_never_holds_more_than_the_budget(tmp_path: Path) -> None:
    big = torch.randn(1000, 257)  # ~1 MiB in one piece
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(big=big)})
    snapshot = Snapshot(str(tmp_path / "s"))
    destination = torch.zeros(257, 1000).t()  # strided: must bounce
    loader = LeafLoader(weights_only=True)
    view = rank_view(snapshot.metadata, 0)
    loader.add("sd/big", view["sd/big"], destination)
    budget = MemoryBudget(50_000)

    async def run() -> None:
        plugin = FSStoragePlugin(tmp_path / "s")
        await read_pieces(plugin, loader.reads, budget=budget, io_concurrency=4, verify=True)

    asyncio.run(run())
    assert torch.equal(destination, big)
    assert 0 < budget.peak_reserved_bytes <= 50_000


@pytest.mark.parametrize("budget_bytes", [1, 4096, 1 << 30])
def test_take_and_restore_work_at_any_budget(tmp_path: Path, budget_bytes: int) -> None:
    values = {f"t{i}": torch.randn(100, 30).t() for i in range(20)}  # strided: staged copies
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)}, memory_budget_bytes=budget_bytes)
    fresh = StateDict({k: torch.zeros(100, 30).t() for k in values})
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh}, memory_budget_bytes=budget_bytes)
    for key, value in values.items():
        assert torch.equal(fresh[key], value)
