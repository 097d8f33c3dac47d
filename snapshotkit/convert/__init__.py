"""Conversion between snapshotkit snapshots and the files other libraries load with their own APIs.

``export_snapshot(src, dst, to="torch" | "safetensors" | "dcp")`` writes a snapshot as one
``torch.save`` file, safetensors file(s), or a ``torch.distributed.checkpoint`` directory. See
``docs/convert.md``.
"""

from __future__ import annotations

from snapshotkit.convert._export import ExportReport, export_snapshot

__all__ = ["ExportReport", "export_snapshot"]
