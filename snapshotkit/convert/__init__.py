"""Checkpoints of other libraries in, snapshots out.

from snapshotkit.convert import import_snapshot

report = import_snapshot("model.safetensors", "/ckpt/imported")   # or a torch.save file, a DCP or torchsnapshot dir
Snapshot("/ckpt/imported").restore({"model": module})

The command line does the same: ``snapshotkit import SRC OUT --from torch|safetensors|dcp|torchsnapshot``.
"""

from __future__ import annotations

from snapshotkit.convert._import import ImportReport, import_snapshot

__all__ = ["ImportReport", "import_snapshot"]
