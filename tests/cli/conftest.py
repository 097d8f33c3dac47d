"""The command line's tests share one manager root per module (tests/conftest.py puts logging back)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli._cli import make_root


@pytest.fixture(scope="module")
def pristine_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli") / "run"
    make_root(root)
    return root


@pytest.fixture
def root(pristine_root: Path, tmp_path: Path) -> Path:
    """A fresh copy of the module's root, free to damage or prune."""
    copy = tmp_path / "run"
    shutil.copytree(pristine_root, copy)
    return copy
