"""Functions run in child processes of the incremental tests (importable by spawned interpreters)."""

from __future__ import annotations

import torch


def bump_shared(tensor: torch.Tensor, index: int) -> None:
    """Change one element of a tensor in shared memory, from another process."""
    tensor[index] += 1


TENSORS = 4
NUMEL = 1 << 20  # 4 MiB of float32 each: writes take long enough to be cut


def values(step: int) -> dict[str, torch.Tensor]:
    """The state of ``step``: one tensor changes per step, the others are the base's (step 0)."""
    out = {f"w{i}": torch.arange(NUMEL, dtype=torch.float32) * (i + 1) for i in range(TENSORS)}
    if step:
        out[f"w{step % TENSORS}"] += step
    return out


def take_incremental_forever(root: str, ready: object, env: dict[str, str]) -> None:
    """Take ``root/t<step>`` against ``root/base`` step after step until killed."""
    import os

    from snapshotkit import Snapshot, StateDict

    os.environ.update(env)
    ready.set()  # type: ignore[attr-defined]
    step = 0
    while True:
        step += 1
        Snapshot.take(f"{root}/t{step}", {"s": StateDict(**values(step))}, base=f"{root}/base")
