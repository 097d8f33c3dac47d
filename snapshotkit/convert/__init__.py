"""Conversion between snapshotkit snapshots and the checkpoints of other libraries.

from snapshotkit.convert import export_snapshot, import_snapshot

report = import_snapshot("model.safetensors", "/ckpt/imported")   # or a torch.save file, a DCP or torchsnapshot dir
Snapshot("/ckpt/imported").restore({"model": module})
export_snapshot("/ckpt/step_1000", "model.safetensors", to="safetensors", select="model/**", strip_prefix="model/")

``export_snapshot(src, dst, to="torch" | "safetensors" | "dcp")`` writes a snapshot as one
``torch.save`` file, safetensors file(s), or a ``torch.distributed.checkpoint`` directory. The
command line does the same: ``snapshotkit export SNAPSHOT OUT --to ...`` and
``snapshotkit import SRC OUT --from torch|safetensors|dcp|torchsnapshot``. See ``docs/convert.md``.
"""

from __future__ import annotations

from snapshotkit.convert._export import ExportReport, export_snapshot
from snapshotkit.convert._import import ImportReport, import_snapshot

__all__ = ["ExportReport", "ImportReport", "export_snapshot", "import_snapshot"]
