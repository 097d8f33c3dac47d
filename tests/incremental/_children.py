"""Functions run in child processes of the incremental tests (importable by spawned interpreters)."""

from __future__ import annotations

import torch


def bump_shared(tensor: torch.Tensor, index: int) -> None:
    """Change one element of a tensor in shared memory, from another process."""
    tensor[index] += 1
