"""Helpers of the command-line tests: a managed root to look at, the console entry, JSON schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import snapshotkit
from snapshotkit import SnapshotManager, StateDict

#: The checkout the tests import snapshotkit from (the console entry must run the same code).
CHECKOUT = Path(snapshotkit.__file__).resolve().parents[1]


def make_root(root: Path) -> None:
    """A manager's root: steps 100, 200 and 300 of a small model and its optimizer, and the
    leftover of a take that never committed at step 400."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"model": model, "optim": optim, "progress": StateDict(step=0, tag="demo")}
    with SnapshotManager(str(root), preemption_signals=()) as mgr:
        for step in (100, 200, 300):
            model(torch.randn(3, 4)).sum().backward()
            optim.step()
            state["progress"]["step"] = step
            mgr.save(step, state, metrics={"loss": 1.0 / step}, metadata={"lr": 0.1})
    leftover = root / "step_400" / "data"
    leftover.mkdir(parents=True)
    (leftover / "0_00000_0123abcd").write_bytes(b"partial")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m snapshotkit ARGS`` in a fresh interpreter (the console entry, as a shell runs it)."""
    environment = {**os.environ, **(env or {}), "PYTHONPATH": str(CHECKOUT), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "snapshotkit", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def parse_json(stdout: str) -> dict[str, Any]:
    """The one JSON document a command printed (nothing else may be on stdout)."""
    document = json.loads(stdout)
    assert isinstance(document, dict)
    return document


#: Top-level members of each command's JSON document (docs/cli.md), and their types.
SCHEMAS: dict[str, dict[str, Any]] = {
    "snapshotkit.ls/1": {"schema": str, "root": str, "snapshots": list, "snapshot_at_root": bool},
    "snapshotkit.info/1": {
        "schema": str,
        "snapshot": str,
        "format_version": int,
        "snapshotkit_version": str,
        "torch_version": str,
        "created_at": str,
        "world_size": int,
        "user_metadata": dict,
        "snapshot_id": (str, type(None)),
        "storage": dict,
        "totals": dict,
        "depth": int,
        "nodes": list,
    },
    "snapshotkit.verify/1": {
        "schema": str,
        "snapshot": str,
        "ok": bool,
        "bytes_checked": int,
        "pieces_checked": int,
        "problems": list,
    },
    "snapshotkit.diff/1": {
        "schema": str,
        "a": str,
        "b": str,
        "atol": float,
        "rtol": float,
        "identical": bool,
        "compared": int,
        "added": list,
        "removed": list,
        "changed": list,
    },
    "snapshotkit.prune/1": {"schema": str, "root": str, "dry_run": bool, "deleted": list, "kept": list},
    "snapshotkit.cleanup/1": {"schema": str, "root": str, "dry_run": bool, "removed": list, "left_alone": list},
    "snapshotkit.export/1": {
        "schema": str,
        "format": str,
        "files": list,
        "tensors_written": int,
        "bytes_written": int,
        "skipped": list,
    },
    "snapshotkit.consolidate/1": {
        "schema": str,
        "source": str,
        "snapshot": str,
        "snapshot_id": str,
        "bytes": int,
        "referenced_bytes": int,
        "bases": list,
        "data_objects": int,
        "seconds": float,
    },
    "snapshotkit.import/1": {
        "schema": str,
        "source_format": str,
        "source": str,
        "snapshot": str,
        "logical_paths": list,
        "bytes": int,
        "seconds": float,
        "skipped_paths": list,
    },
}
LS_SNAPSHOT_KEYS = {
    "step",
    "path",
    "status",
    "complete",
    "created_at",
    "size_bytes",
    "metrics",
    "reason",
    "user_metadata",
    "error",
    "kind",
    "bases",
}
INFO_NODE_KEYS = {
    "path",
    "depth",
    "kind",
    "leaf",
    "leaves",
    "bytes",
    "truncated",
    "dtype",
    "shape",
    "sharding",
    "ranks",
    "shards",
    "type",
}
INFO_STORAGE_KEYS = {"self_contained", "stored_bytes", "referenced_bytes", "bases"}
INFO_BASE_KEYS = {"location", "path", "snapshot_id", "bytes", "pieces"}
PROBLEM_KEYS = {"logical_path", "location", "kind", "message"}
CHANGE_KEYS = {"logical_path", "what", "a", "b", "max_abs_diff", "mismatched"}


def check_schema(document: dict[str, Any], schema: str) -> None:
    """``document`` has exactly the members of ``schema``, of the documented types."""
    expected = SCHEMAS[schema]
    assert document["schema"] == schema
    assert set(document) == set(expected), set(document) ^ set(expected)
    for name, kind in expected.items():
        assert isinstance(document[name], kind), (name, document[name])
