"""Conversion between snapshotkit snapshots and the checkpoints of other libraries.

from snapshotkit.convert import consolidate_snapshot, export_snapshot, import_snapshot

report = import_snapshot("model.safetensors", "/ckpt/imported")   # or a torch.save file, a DCP or torchsnapshot dir
Snapshot("/ckpt/imported").restore({"model": module})
export_snapshot("/ckpt/step_1000", "model.safetensors", to="safetensors", select="model/**", strip_prefix="model/")
consolidate_snapshot("/ckpt/step_1200", "/ckpt/step_1200_full")   # an incremental snapshot, self-contained

``export_snapshot(src, dst, to="torch" | "safetensors" | "dcp")`` writes a snapshot as one
``torch.save`` file, safetensors file(s), or a ``torch.distributed.checkpoint`` directory. The
command line does the same: ``snapshotkit export SNAPSHOT OUT --to ...`` and
``snapshotkit import SRC OUT --from torch|safetensors|dcp|torchsnapshot``.
``consolidate_snapshot(src, dst)`` (``snapshotkit consolidate SRC DST``) copies a snapshot, and every
piece it references in its bases, into a self-contained snapshot. See ``docs/convert.md``.
"""

from __future__ import annotations

from snapshotkit.convert._consolidate import consolidate_snapshot
from snapshotkit.convert._export import ExportReport, export_snapshot
from snapshotkit.convert._import import ImportReport, import_snapshot

__all__ = ["ExportReport", "ImportReport", "consolidate_snapshot", "export_snapshot", "import_snapshot"]
