"""Every test under ``tests/gpu/`` needs CUDA: without it they are collected and skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is not available on this machine")
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(skip)
