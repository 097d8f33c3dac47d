"""``_custom_tensor_prepare_func`` on sharded tensors: each rank's local shards are prepared, and a
rank holding no shard still agrees on the stored dtype (3 gloo ranks)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from snapshotkit import Snapshot, StateDict
from snapshotkit.manifest import ShardedTensorEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _to_bfloat16(path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
    return tensor.to(torch.bfloat16)


def _take_and_restore(rank: int, world: int, path: str) -> dict[str, Any]:
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    full = torch.linspace(-3, 3, 6 * 4).reshape(6, 4)
    table = distribute_tensor(full, mesh, [Shard(0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ShardedTensor is deprecated in favour of DTensor
        spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"])
        two_rows = sharded_tensor.empty(spec, 2, 3)  # the last rank holds no shard of it
        for shard in two_rows.local_shards():
            shard.tensor.fill_(0.5 + shard.metadata.shard_offsets[0])
        held = len(two_rows.local_shards())
        Snapshot.take(path, {"s": StateDict(table=table, two_rows=two_rows)}, _custom_tensor_prepare_func=_to_bfloat16)

    destination = distribute_tensor(torch.zeros(6, 4, dtype=torch.bfloat16), mesh, [Shard(1)])
    Snapshot(path).restore({"s": StateDict(table=destination, two_rows=torch.zeros(2, 3, dtype=torch.bfloat16))})
    return {
        "held": held,
        "table": torch.equal(destination.full_tensor(), full.to(torch.bfloat16)),
        "two_rows": Snapshot(path).read_object("s/two_rows").tolist(),
    }


def test_local_shards_are_prepared_and_every_rank_agrees_on_the_dtype(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(3, _take_and_restore, path)
    assert [r["held"] for r in results] == [1, 1, 0]
    assert all(r["table"] for r in results)
    assert all(r["two_rows"] == [[0.5] * 3, [1.5] * 3] for r in results)
    manifest = Snapshot(path).get_manifest()
    for key in ("0/s/table", "0/s/two_rows"):
        entry = manifest[key]
        assert isinstance(entry, ShardedTensorEntry) and entry.dtype == "bfloat16", entry
