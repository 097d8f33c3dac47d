"""Build the golden snapshot of format version 2: ``python tests/golden/make_golden_v2.py``.

Two gloo ranks (forked, CPU) take ``tests/golden/v2/sharded``: a DTensor sharded over a 2-D
mesh is not possible on 2 ranks, so it holds a ``Shard(0)`` DTensor (uneven: 5 rows over 2
ranks), a ``Shard(1)``/``Replicate`` pair on a 1-D mesh, a replicated model (DDP), and rank-local
state. Small chunks make multi-piece shards. Committed; ``tests/format/test_golden_v2.py`` must keep
reading it value for value. Regenerate only when this builder changes.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GOLDEN = Path(__file__).resolve().parent / "v2" / "sharded"
ENV = {"SNAPSHOTKIT_CHUNK_BYTES": "64", "SNAPSHOTKIT_DATA_OBJECT_BYTES": "1024"}


def full_table() -> torch.Tensor:
    return torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6) / 4


def full_columns() -> torch.Tensor:
    return torch.arange(4 * 7, dtype=torch.int64).reshape(4, 7) - 10


def model() -> torch.nn.Module:
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8)
        layer.bias.copy_(torch.tensor([0.5, -0.25]))
    return layer


def _rank(rank: int, port: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel

    from snapshotkit import Snapshot, StateDict

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **ENV)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = dist.device_mesh.init_device_mesh("cpu", (2,))
    app_state = {
        "model": DistributedDataParallel(model()),
        "tables": StateDict(
            rows=distribute_tensor(full_table(), mesh, [Shard(0)]),
            columns=distribute_tensor(full_columns(), mesh, [Shard(1)]),
            everywhere=distribute_tensor(torch.tensor([1.5, 2.5, 3.5]), mesh, [Replicate()]),
        ),
        "progress": StateDict(step=100 + rank, tag=f"rank {rank}"),
    }
    Snapshot.take(str(GOLDEN), app_state)
    dist.destroy_process_group()


def main() -> None:
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_rank, args=(port,), nprocs=2, start_method="fork")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
