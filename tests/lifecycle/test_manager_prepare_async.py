"""``SnapshotManager(async_executor=...)``: restore_latest warms the writer its async saves use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import SnapshotManager, StateDict
from snapshotkit._take import executors
from snapshotkit.errors import ConfigError


def test_restore_latest_warms_the_first_async_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[tuple[str, int], Any] = {}
    monkeypatch.setattr(executors, "_writers", made)
    state = {"w": StateDict({"t": torch.arange(1 << 20, dtype=torch.float32)})}
    with SnapshotManager(str(tmp_path), preemption_signals=()) as mgr:
        assert mgr.restore_latest(state) is None
        buffers = made[("thread", 19)]._buffers  # type: ignore[attr-defined]
        allocated = list(buffers.allocated)
        assert allocated
        mgr.save(1, state, async_take=True).wait()
        assert buffers.allocated == allocated


def test_no_warm_up_with_none_and_a_bad_executor_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[tuple[str, int], Any] = {}
    monkeypatch.setattr(executors, "_writers", made)
    with SnapshotManager(str(tmp_path), preemption_signals=(), async_executor=None) as mgr:
        mgr.restore_latest({"w": StateDict({"t": torch.ones(4)})})
    assert not made
    with pytest.raises(ConfigError):
        SnapshotManager(str(tmp_path), preemption_signals=(), async_executor="fork")
