"""``SnapshotCheckpointIO`` under ``torch.distributed``, as Lightning's strategies call it: global
rank 0 saves and removes alone (the other ranks never call), every rank loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _save_on_rank_zero_load_everywhere(rank: int, world: int, folder: str) -> dict[str, Any]:
    import torch.distributed as dist

    from snapshotkit.lightning import SnapshotCheckpointIO

    io = SnapshotCheckpointIO(async_save=True)
    path = f"{folder}/last.ckpt"
    if rank == 0:  # the others are elsewhere (in their training step): no collective may wait for them
        io.save_checkpoint({"state_dict": {"w": torch.full((3,), 7.0)}, "global_step": 1}, path)
        io.save_checkpoint({"state_dict": {"w": torch.full((3,), 8.0)}, "global_step": 2}, path)
        io.save_checkpoint({"state_dict": {"w": torch.full((3,), 9.0)}, "global_step": 3}, f"{folder}/other.ckpt")
        io.remove_checkpoint(f"{folder}/other.ckpt")
        io.teardown()
    dist.barrier()
    loaded = io.load_checkpoint(path)
    dist.barrier()
    return {"w": loaded["state_dict"]["w"].tolist(), "global_step": loaded["global_step"]}


def test_rank_zero_saves_alone_and_every_rank_loads(tmp_path: Path) -> None:
    results = run_ranks(2, _save_on_rank_zero_load_everywhere, str(tmp_path), timeout=180)
    assert results == [{"w": [8.0, 8.0, 8.0], "global_step": 2}] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
