"""DTensor on CUDA with NCCL, two ranks on two GPUs: ``async_take`` after a long kernel, then a restore."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
from multirank._harness import run_ranks

pytestmark = [
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
    pytest.mark.timeout(300),
]


def _take_and_restore(rank: int, world_size: int, path: str, executor: str) -> bool:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    from snapshotkit import Snapshot, StateDict

    mesh = dist.device_mesh.init_device_mesh("cuda", (world_size,))
    full = torch.arange(256 * 1024, dtype=torch.float32).reshape(256, 1024)
    table = distribute_tensor(torch.zeros(256, 1024, device="cuda"), mesh, [Shard(0)])
    final = distribute_tensor(full.cuda(), mesh, [Shard(0)])
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    table.to_local().copy_(final.to_local())  # queued behind the sleep
    if executor == "sync":
        Snapshot.take(path, {"m": StateDict(w=table)})
    else:
        Snapshot.async_take(path, {"m": StateDict(w=table)}, executor=executor).wait()
    out = distribute_tensor(torch.zeros(256, 1024, device="cuda"), mesh, [Shard(1)])
    Snapshot(path).restore({"m": StateDict(w=out)})
    return bool(torch.equal(out.full_tensor().cpu(), full))


@pytest.mark.parametrize("executor", ["sync", "thread", "process"])
def test_dtensor_on_two_gpus_round_trips(tmp_path: Path, executor: str) -> None:
    results = run_ranks(2, _take_and_restore, str(tmp_path / "s"), executor, backend="nccl", timeout=240)
    assert results == [True, True]
