"""Test helpers for storage plugin authors.

:class:`StoragePluginConformance` is the conformance suite every built-in storage plugin passes;
subclass it in your plugin's tests (see :mod:`snapshotkit.testing._conformance` for an example).
Importing this package needs pytest.
"""

from __future__ import annotations

from ._conformance import StoragePluginConformance

__all__ = ["StoragePluginConformance"]
