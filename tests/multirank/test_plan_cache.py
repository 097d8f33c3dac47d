"""Plan reuse on real gloo ranks: one small all-reduce per unchanged take, and a full plan whenever any
single rank changed anything (never a stale plan: every snapshot restores bit-exact)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from snapshotkit import Snapshot, StateDict

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "all_gather_object", "broadcast_object_list", "barrier")


def _state(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same replicated and global tensors on every rank
    model = StateDict(w=torch.rand(16, 8), b=torch.rand(8), step=3)
    table = distribute_tensor(torch.rand(4 * world, 6), mesh, [Shard(0)])
    local = StateDict(x=torch.full((5,), float(rank)), tag=f"rank-{rank}", seen={rank})
    return {"model": model, "table": StateDict(t=table), "local": local}


def _restore_equals(path: str, app_state: dict[str, Any], rank: int, world: int) -> None:
    """Restore ``path`` into fresh destinations shaped like ``app_state`` and compare bit for bit."""
    from torch.distributed.tensor import DTensor

    def blank(value: Any) -> Any:
        if isinstance(value, DTensor):
            return torch.distributed.tensor.zeros(
                value.shape, device_mesh=value.device_mesh, placements=value.placements
            )
        return torch.zeros_like(value) if isinstance(value, torch.Tensor) else None

    targets = {key: StateDict({k: blank(v) for k, v in sd.items()}) for key, sd in app_state.items()}
    Snapshot(path).restore(targets)
    for key, sd in app_state.items():
        for name, value in sd.items():
            got = targets[key][name]
            if isinstance(value, torch.Tensor):
                assert got.dtype == value.dtype and got.shape == value.shape, (rank, key, name)
                if hasattr(value, "to_local"):
                    assert torch.equal(got.to_local(), value.to_local()), (rank, key, name)
                else:
                    assert torch.equal(got, value), (rank, key, name)
            else:
                assert got == value, (rank, key, name)


CHANGES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "replicated shape": lambda s: s["model"].update(w=torch.rand(8, 16)),
    "replicated dtype": lambda s: s["model"].update(b=s["model"]["b"].double()),
    "local shape": lambda s: s["local"].update(x=torch.ones(6)),
    "entry added": lambda s: s["local"].update(y=torch.ones(2)),
    "entry removed": lambda s: s["local"].pop("x"),
    "replicated primitive value": lambda s: s["model"].update(step=4),
}


#: The changes that make rank 1's replicated candidates (its first part in the exchange) differ.
REPLICATED_PART_CHANGES = {"replicated shape", "replicated dtype", "replicated primitive value", "replication"}


def _counting(calls: dict[str, int], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    return counted


def _take_with_change(rank: int, world: int, root: str, change: str) -> dict[str, Any]:
    from snapshotkit._take import engine

    calls: dict[str, int] = dict.fromkeys(COLLECTIVES, 0)
    for name in COLLECTIVES:  # count every torch.distributed collective this process makes
        setattr(dist, name, _counting(calls, name, getattr(dist, name)))
    takes: list[tuple[bool, int]] = []
    real_prepare = engine.prepare_take

    def recording(*args: Any, **kwargs: Any) -> Any:
        before = sum(calls.values())
        prepared = real_prepare(*args, **kwargs)
        takes.append((prepared.plan_reused, sum(calls.values()) - before))
        return prepared

    engine.prepare_take = recording  # type: ignore[assignment]
    app_state = _state(rank, world)
    replicated = ["model/**"]
    Snapshot.take(f"{root}/a", app_state, replicated=replicated)
    app_state["model"]["step"] = 4  # the same on every rank: the plan holds
    Snapshot.take(f"{root}/b", app_state, replicated=replicated)
    if change == "replication":
        replicated = ["model/w"] if rank == 1 else replicated
    elif change == "replicated primitive value":
        app_state["model"]["step"] = 5 if rank == 1 else 4
    elif rank == 1:
        CHANGES[change](app_state)
    Snapshot.take(f"{root}/c", app_state, replicated=replicated)
    Snapshot.take(f"{root}/d", app_state, replicated=replicated)
    for name in "abcd":
        Snapshot(f"{root}/{name}").get_manifest()  # every take committed
    _restore_equals(f"{root}/c", app_state, rank, world)
    _restore_equals(f"{root}/d", app_state, rank, world)
    return {"takes": takes}


@pytest.mark.parametrize("change", [*sorted(CHANGES), "replication"])
def test_a_change_on_one_rank_makes_every_rank_plan_again(tmp_path: Any, change: str) -> None:
    results = run_ranks(3, _take_with_change, str(tmp_path), change)
    for rank, result in enumerate(results):
        reused = [reused for reused, _ in result["takes"]]
        assert reused == [False, True, False, True], (rank, change)
        collectives = [count for _, count in result["takes"]]
        # planning from scratch: the agreement all-reduce, the exchange's all-gather of headers and
        # one broadcast per distinct part (two when every rank describes its state alike, three when
        # rank 1's replicated part differs); reusing: the agreement alone
        changed = 5 if change in REPLICATED_PART_CHANGES else 4
        assert collectives == [4, 1, changed, 1], (rank, change)
