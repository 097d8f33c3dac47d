"""The first take's exchange (``_take/exchange.py``) on real gloo ranks: headers, then each
distinct part once; the bytes each rank receives counted; a lost or late rank raises our errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from plan._world import StateBuilder

from snapshotkit import Snapshot, StateDict
from snapshotkit._dist import Group, resolve_group
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import decide
from snapshotkit._plan.gathered import Gathered
from snapshotkit._plan.leaves import RankInfo, rank_info
from snapshotkit._take import exchange
from snapshotkit._take.exchange import Encoded, exchange_descriptions, header_bytes
from snapshotkit.errors import CollectiveTimeoutError, RankFailedError

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240)]


def _info(rank: int, world: int, kind: str) -> RankInfo:
    """``same``: every rank alike; ``partly``: ranks 0-1 alike, the others each their own
    replicated leaves; ``different``: every rank its own boxes (one sharded part per rank)."""
    builder = StateBuilder().tensor("model/w", (16, 4)).tensor(f"local/{rank}", (rank + 1,))
    if kind == "partly" and rank >= 2:
        builder.tensor("model/extra", (rank,))
    rows = 2
    if kind == "different":
        builder.sharded("dt", (rows * world, 3), [Box((rank * rows, 0), (rows, 3))])
    else:
        builder.sharded("dt", (rows * world, 3), [Box((r * rows, 0), (rows, 3)) for r in range(world)])
    return rank_info(builder.build(), "/ckpt", ("model/*",), "id")


def _exchange(rank: int, world: int, kind: str, broadcast_limit: int) -> dict[str, Any]:
    exchange.MAX_BROADCAST_PARTS = broadcast_limit  # this rank's process only
    group = resolve_group(None, timeout_seconds=60)
    got = exchange_descriptions(group, _info(rank, world, kind), None, "test exchange", "nothing was written")
    decision = decide(got.gathered, chunk_bytes=32)
    return {"received": got.received_bytes, "owner": dict(decision.owner), "path": got.gathered.path}


def _expected_received(rank: int, infos: list[RankInfo], broadcast_limit: int) -> int:
    encoded = [Encoded.of(info) for info in infos]
    total = header_bytes(len(infos))
    for kind in ("replicated", "sharded"):
        parts = [getattr(e, kind) for e in encoded]
        first: dict[bytes, int] = {}
        for source, part in enumerate(parts):
            first.setdefault(part, source)
        if len(first) <= broadcast_limit:
            total += sum(len(part) for part, source in first.items() if source != rank)
        else:
            import pickle

            longest = max(len(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)) for part in parts)
            total += 8 * len(parts) + len(parts) * longest
    return total


@pytest.mark.parametrize(
    ("world", "kind", "limit"),
    [(2, "same", 64), (4, "same", 64), (3, "partly", 64), (4, "different", 64), (4, "different", 1)],
)
def test_every_rank_decides_as_with_every_description(world: int, kind: str, limit: int) -> None:
    results = run_ranks(world, _exchange, kind, limit)
    infos = [_info(rank, world, kind) for rank in range(world)]
    expected = decide(Gathered.of_infos(infos), chunk_bytes=32)
    for rank, result in enumerate(results):
        assert result["owner"] == dict(expected.owner)
        assert result["path"] == "/ckpt"
        assert result["received"] == _expected_received(rank, infos, limit), (rank, kind)
    if kind == "same":  # headers plus one copy of each part: far less than every rank's description
        every = sum(len(e.replicated) + len(e.sharded) for e in map(Encoded.of, infos))
        assert max(r["received"] for r in results) < every


# ------------------------------------------------------------------ DTensor state


def _take_dtensors(rank: int, world: int, root: str) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from snapshotkit._plan.select import Selection
    from snapshotkit._take.collect import collect_state, describe_state

    mesh = dist.device_mesh.init_device_mesh("cpu", (2, world // 2))
    torch.manual_seed(0)
    full = {name: torch.rand(9, 2 << 16) for name in ("rows", "columns", "both")}  # Shard(1): column sub-boxes
    state = {
        "rows": distribute_tensor(full["rows"], mesh, [Shard(0), Replicate()]),
        "columns": distribute_tensor(full["columns"], mesh, [Replicate(), Shard(1)]),
        "both": distribute_tensor(full["both"], mesh, [Shard(0), Shard(1)]),
    }
    app_state = {"m": StateDict(state)}
    local = describe_state(collect_state(app_state), Selection.of(None, None), None)
    grids = [leaf.grid is not None for leaf in local.leaves.values() if hasattr(leaf, "grid")]
    Snapshot.take(f"{root}/snap", app_state)
    blank = {
        "m": StateDict(
            {
                name: torch.distributed.tensor.zeros(v.shape, device_mesh=mesh, placements=v.placements)
                for name, v in state.items()
            }
        )
    }
    Snapshot(f"{root}/snap").restore(blank)
    equal = all(torch.equal(blank["m"][name].to_local(), state[name].to_local()) for name in state)
    return {"grids": grids, "equal": equal}


def test_dtensors_are_described_by_their_grid_and_restore_bit_exact(tmp_path: Path) -> None:
    for result in run_ranks(4, _take_dtensors, str(tmp_path)):
        assert result == {"grids": [True, True, True], "equal": True}


# ------------------------------------------------------------------ a rank lost or late


def _lose_a_rank(rank: int, world: int, when: str, root: str) -> str:
    group = Group(rank, world, None, timeout_seconds=10)
    info = _info(rank, world, "partly")  # ranks 2 and 3 hold parts only they can send
    if rank == world - 1:
        if when == "round 2":
            group.all_gather_int64(Encoded.of(info).header.to_int64(), "test")  # round 1, then gone
        os._exit(0)  # killed: no result, no goodbye
    try:
        exchange_descriptions(group, info, None, "test exchange", "nothing was written")
    except (RankFailedError, CollectiveTimeoutError) as exc:
        return type(exc).__name__
    return "no error"


@pytest.mark.parametrize("when", ["round 1", "round 2"])
def test_a_rank_lost_in_either_round_raises_our_error(tmp_path: Path, when: str) -> None:
    results = run_ranks(4, _lose_a_rank, when, str(tmp_path), missing_ok=True)
    assert results[-1] is None
    assert all(result in ("RankFailedError", "CollectiveTimeoutError") for result in results[:-1]), results


def _late_rank(rank: int, world: int) -> str:
    group = Group(rank, world, None, timeout_seconds=2)
    store = group.store()
    info = _info(rank, world, "partly")
    if rank == world - 1:  # answers round 1, then waits until the others gave up on round 2
        group.all_gather_int64(Encoded.of(info).header.to_int64(), "test")
        store.wait([f"gave-up-{r}" for r in range(world - 1)])
        return "late"
    try:
        exchange_descriptions(group, info, None, "test exchange", "nothing was written")
    except CollectiveTimeoutError as exc:
        return "timed out" if "test exchange" in str(exc) else f"another timeout: {exc}"
    finally:
        store.set(f"gave-up-{rank}", "1")
    return "no error"


def test_a_late_rank_makes_the_others_time_out_with_our_error() -> None:
    assert run_ranks(4, _late_rank) == ["timed out", "timed out", "timed out", "late"]
