"""snapshotkit: save and restore the whole state of a PyTorch program, fast and safely.

from snapshotkit import Snapshot, StateDict, RNGState

snapshot = Snapshot.take("/ckpt/step_1000", {"model": model, "optim": optim, "rng": RNGState()})
report = Snapshot("/ckpt/step_1000").restore({"model": model, "optim": optim, "rng": RNGState()})
weight = Snapshot("/ckpt/step_1000").read_object("model/layer1.weight")

Code written for torchsnapshot runs with ``import snapshotkit as torchsnapshot``: the names it
exports are exported here and take the same arguments (``docs/torchsnapshot.md``).
"""

from __future__ import annotations

from snapshotkit import errors, events
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._restore.partial import RestoreReport
from snapshotkit._version import __version__
from snapshotkit.manager import SnapshotManager
from snapshotkit.snapshot import PendingSnapshot, Snapshot
from snapshotkit.stateful import AppState, RNGState, StateDict, Stateful

__all__ = [
    "AppState",
    "PendingSnapshot",
    "RNGState",
    "RestoreReport",
    "Snapshot",
    "SnapshotManager",
    "SnapshotMetadata",
    "StateDict",
    "Stateful",
    "__version__",
    "errors",
    "events",
]
