"""The process group's store after many ``async_take`` commits: every key a commit sets is deleted
once every rank has read it, so a long run does not grow rank 0's store (issue 24, item 4)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from take._commit_faults import SCHEME, Fault, installed_faults

from snapshotkit import Snapshot, StateDict

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _async_takes(rank: int, world: int, root: str, count: int, fail_at: int) -> list[int]:
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    counts = [store.num_keys()]
    for step in range(count):
        state = {"model": StateDict(w=torch.full((256,), float(step + rank))), "shared": StateDict(step=step)}
        # At ``fail_at`` rank 1's writes fail: the keys of a failed commit must go too.
        faults = (Fault("write", "fail", rank=1),) if step == fail_at else ()
        with installed_faults(faults, rank, delay_s=0.0), contextlib.suppress(Exception):  # the point of that step
            Snapshot.async_take(f"{SCHEME}://{root}/step_{step}", state, replicated=["shared/**"]).wait()
        dist.barrier()
        counts.append(store.num_keys())
    return counts


def test_the_store_does_not_grow_with_async_takes(tmp_path: Path) -> None:
    results = run_ranks(2, _async_takes, str(tmp_path), 35, 17, timeout=200)
    for rank, counts in enumerate(results):
        assert counts == [counts[0]] * len(counts), f"rank {rank}: store keys after each take: {counts}"
    assert sorted(p.name for p in tmp_path.iterdir() if (p / ".snapshot_metadata").exists()) == sorted(
        f"step_{i}" for i in range(35) if i != 17
    )
