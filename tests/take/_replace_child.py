"""Run in a child process by the kill -9 test of replacing takes (importable by forkserver children)."""

from __future__ import annotations

from typing import Any

import torch

NUMEL = 1 << 20  # 4 MiB of float32 per tensor: a save takes long enough to be cut


def checkpoint(step: int) -> dict[str, Any]:
    """The checkpoint dict of ``step``: every tensor depends on it."""
    return {
        "global_step": step,
        "state_dict": {f"w{i}": torch.arange(NUMEL, dtype=torch.float32) * (i + 1) + step for i in range(4)},
    }


def save_forever(path: str, async_save: bool, ready: Any) -> None:
    """Save ``checkpoint(step)`` onto ``path`` through ``SnapshotCheckpointIO``, step after step."""
    from snapshotkit.lightning import SnapshotCheckpointIO

    io = SnapshotCheckpointIO(async_save=async_save)
    io.save_checkpoint(checkpoint(1), path)
    io.teardown()
    ready.set()
    step = 1
    while True:
        step += 1
        io.save_checkpoint(checkpoint(step), path)


def assert_whole(path: str) -> int:
    """Load ``path`` and check it is exactly the checkpoint of the step it holds; that step."""
    from snapshotkit.lightning import SnapshotCheckpointIO

    loaded = SnapshotCheckpointIO().load_checkpoint(path)
    step = loaded["global_step"]
    expected = checkpoint(step)
    assert loaded["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(loaded["state_dict"][name], tensor), f"{path}: {name} is not step {step}'s"
    return int(step)
