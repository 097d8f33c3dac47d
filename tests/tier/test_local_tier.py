"""The local tier in one process (no torch.distributed): saves at both intervals, restore_latest
prefers the local copy, falls back to the durable tier when the copy is gone or damaged, and
local retention keeps the newest ``local_keep_last`` steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import PendingSnapshot, Snapshot, SnapshotManager, StateDict
from snapshotkit.errors import ConfigError


def _manager(tmp_path: Path, **kwargs: object) -> SnapshotManager:
    options = {"save_interval_steps": 4, "local_root": str(tmp_path / "local"), "local_interval_steps": 2}
    return SnapshotManager(
        str(tmp_path / "durable"), preemption_signals=(), async_executor=None, **{**options, **kwargs}
    )


def _run(mgr: SnapshotManager, steps: int, *, async_take: bool = False) -> StateDict:
    state = StateDict(w=torch.zeros(16), step=0)
    for step in range(1, steps + 1):
        state["w"] = state["w"] + step
        state["step"] = step
        if mgr.should_save(step):
            result = mgr.save(step, {"s": state}, async_take=async_take)
            assert isinstance(result, PendingSnapshot if async_take else Snapshot)
    mgr.close()
    return state


def _expected(step: int) -> torch.Tensor:
    return torch.full((16,), float(sum(range(1, step + 1))))


@pytest.mark.parametrize("async_take", [False, True])
def test_saves_on_both_tiers_and_resumes_from_the_local_one(tmp_path: Path, async_take: bool) -> None:
    _run(_manager(tmp_path), 7, async_take=async_take)
    local = tmp_path / "local"
    assert sorted(p.name for p in local.iterdir()) == ["step_4", "step_6"]  # local_keep_last=2
    assert sorted(p.name for p in (tmp_path / "durable").iterdir()) == ["step_4"]
    mgr = _manager(tmp_path)
    state = StateDict(w=torch.zeros(16), step=-1)
    assert mgr.restore_latest({"s": state}) == 6
    assert torch.equal(state["w"], _expected(6)) and state["step"] == 6
    assert mgr.last_restore_report is not None and mgr.last_restore_report.source == "local"
    mgr.close()


def test_a_lost_or_damaged_local_copy_falls_back_to_the_durable_step(tmp_path: Path) -> None:
    _run(_manager(tmp_path), 7)
    copy = tmp_path / "local" / "step_6" / "rank_0"
    data = max((p for p in (copy / "data").iterdir()), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x01
    data.write_bytes(bytes(raw))
    mgr = _manager(tmp_path)
    state = StateDict(w=torch.zeros(16), step=-1)
    with pytest.warns(RuntimeWarning, match="step 6"):
        step = mgr.restore_latest({"s": state})
    # step 4 is intact on both tiers: the local copy serves it
    assert step == 4 and torch.equal(state["w"], _expected(4))
    assert not copy.exists()  # the damaged copy is deleted, never used again
    mgr.close()


def test_local_tier_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="local_interval_steps"):
        SnapshotManager(str(tmp_path / "d"), local_root=str(tmp_path / "l"))
    with pytest.raises(ConfigError, match="nodes"):  # one process is one node: no peer to hold a replica
        SnapshotManager(str(tmp_path / "d"), local_root=str(tmp_path / "l"), local_interval_steps=2, local_replicas=1)
    assert not (tmp_path / "l").exists()


def test_a_save_with_base_takes_the_local_copy_whole(tmp_path: Path) -> None:
    """``base=`` (a durable step) is for the durable take: the local copy of the same save used to
    get it too, and every such save raised ConfigError (the base is not beside the local copy)."""
    mgr = _manager(tmp_path)
    state = StateDict(w=torch.arange(1 << 16, dtype=torch.float32), frozen=torch.ones(1 << 16))
    mgr.save(4, {"s": state})
    state["w"][:8] += 1  # "frozen" is unchanged: the durable step references it
    snapshot = mgr.save(8, {"s": state}, base=mgr.snapshot_path(4))
    assert isinstance(snapshot, Snapshot) and snapshot.metadata.bases  # the durable step is incremental
    copy = Snapshot(str(tmp_path / "local" / "step_8" / "rank_0"))
    assert not copy.metadata.bases and torch.equal(copy.read_object("s/w"), state["w"])
    mgr.close()
