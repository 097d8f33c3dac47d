"""Every built-in storage scheme is checked by a conformance subclass in this package."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from snapshotkit.storage._registry import _BUILTIN, split_uri
from snapshotkit.testing import StoragePluginConformance


def _conformance_subclasses() -> list[type[StoragePluginConformance]]:
    """Import every test module next to this one and collect the conformance subclasses they define."""
    modules = {
        importlib.import_module(f"{__package__}.{info.name}").__name__
        for info in pkgutil.iter_modules([str(Path(__file__).parent)])
        if info.name.startswith("test_")
    }
    found: list[type[StoragePluginConformance]] = []
    pending = list(StoragePluginConformance.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ in modules:
            found.append(cls)
    return found


def test_every_builtin_scheme_has_a_conformance_subclass() -> None:
    covered_schemes = {split_uri(cls().uri("conformance-root"))[0] for cls in _conformance_subclasses()}
    # Aliases ("gs" and "gcs") share one factory: covering one of them covers the plugin.
    covered_factories = {_BUILTIN[s] for s in covered_schemes if s in _BUILTIN}
    missing = {scheme for scheme, factory in _BUILTIN.items() if factory not in covered_factories}
    assert {"file", "memory"} <= set(_BUILTIN)
    assert not missing, f"built-in schemes without a StoragePluginConformance subclass in tests/storage: {missing}"
