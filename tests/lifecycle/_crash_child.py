"""Children for the kill -9 tests: each works on a root until the test kills it with SIGKILL.

Every value a child saves is a function of the step (``values(step)``), so the test can check
a restored snapshot bit for bit without talking to the child.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from snapshotkit import Snapshot, SnapshotManager, StateDict

TENSORS = 4
NUMEL = 1 << 20  # 4 MiB of float32 each: writes take long enough to be cut


def values(step: int) -> dict[str, Any]:
    return {f"w{i}": torch.arange(NUMEL, dtype=torch.float32) * (i + 1) + step for i in range(TENSORS)}


def state_for(step: int) -> dict[str, Any]:
    return {"s": StateDict(step=step, **values(step))}


def fill(state: dict[str, Any], step: int) -> None:
    state["s"]["step"] = step
    for name, tensor in values(step).items():
        state["s"][name].copy_(tensor)


def save_forever(root: str, ready: Any, async_take: bool, keep_last: int | None) -> None:
    """Save step after step (async or with retention deleting behind) until killed."""
    state = state_for(0)
    mgr = SnapshotManager(root, keep_last=keep_last, preemption_signals=())
    step = mgr.latest_step() or 0
    ready.set()
    while True:
        step += 1
        fill(state, step)
        mgr.save(step, state, async_take=async_take)


def open_and_clean(root: str, ready: Any) -> None:
    """Open the root (its clean-up removes incomplete snapshots) and keep cleaning until killed."""
    ready.set()
    mgr = SnapshotManager(root, preemption_signals=())
    while True:
        mgr.cleanup()


def make_root(root: str, committed: list[int], incomplete: list[int]) -> None:
    """Committed snapshots of ``committed`` and, for ``incomplete``, data objects with no manifest."""
    for step in committed + incomplete:
        Snapshot.take(f"{root}/step_{step}", state_for(step))
    for step in incomplete:
        os.unlink(f"{root}/step_{step}/.snapshot_metadata")
