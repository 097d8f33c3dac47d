"""Test helpers for storage plugin authors.

:class:`StoragePluginConformance` is the conformance suite every built-in storage plugin passes;
subclass it in your plugin's tests (see :mod:`snapshotkit.testing._conformance` for an example).
:class:`SeaweedS3Server` and :class:`FakeGCSServer` start real object-store servers on loopback;
:class:`FaultInjectingProxy` sits in front of one and injects error statuses and connection
resets; :class:`FaultInjectingPlugin` wraps any storage plugin and fails a seeded fraction of its
calls with resets, timeouts, throttling and lost responses. Importing this package needs pytest.
"""

from __future__ import annotations

from snapshotkit.testing._conformance import StoragePluginConformance
from snapshotkit.testing._faults import FAULT_KINDS, FaultInjectingPlugin
from snapshotkit.testing._proxy import LOSE_RESPONSE, RESET, FaultInjectingProxy, SeenRequest
from snapshotkit.testing._servers import FakeGCSServer, SeaweedS3Server, ServerUnavailable

__all__ = [
    "FAULT_KINDS",
    "FakeGCSServer",
    "FaultInjectingPlugin",
    "FaultInjectingProxy",
    "LOSE_RESPONSE",
    "RESET",
    "SeaweedS3Server",
    "SeenRequest",
    "ServerUnavailable",
    "StoragePluginConformance",
]
