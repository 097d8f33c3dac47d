"""The public surface is curated: every public module has a complete, sorted ``__all__``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import snapshotkit

PUBLIC_MODULES = [
    "snapshotkit",
    "snapshotkit.cli",
    "snapshotkit.convert",
    "snapshotkit.dcp",
    "snapshotkit.diff",
    "snapshotkit.errors",
    "snapshotkit.events",
    "snapshotkit.lightning",
    "snapshotkit.manager",
    "snapshotkit.manifest",
    "snapshotkit.stateful",
    "snapshotkit.snapshot",
    "snapshotkit.storage",
    "snapshotkit.testing",
    "snapshotkit.verify",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_sorted_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


def test_top_level_exports() -> None:
    assert set(snapshotkit.__all__) >= {
        "RestoreReport",
        "Snapshot",
        "SnapshotManager",
        "Stateful",
        "StateDict",
        "RNGState",
        "__version__",
        "errors",
        "events",
    }


def test_private_modules_are_underscored_and_public_ones_listed() -> None:
    found = {
        info.name
        for info in pkgutil.walk_packages(snapshotkit.__path__, "snapshotkit.")
        # private: any component is underscored (modules inside a private package need not be)
        if not any(part.startswith("_") for part in info.name.split(".")[1:])
    }
    assert found <= set(PUBLIC_MODULES) | {"snapshotkit.testing"}, found - set(PUBLIC_MODULES)
