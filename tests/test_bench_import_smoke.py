"""Smoke test for benchmarks/bench_import.py: tiny sizes, every format, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_import.py"


@pytest.mark.slow
def test_bench_import_smoke(tmp_path: Path) -> None:
    out = tmp_path / "import.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path / "scratch"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"bench_import.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert set(report["formats"]) == {"torch", "safetensors", "dcp", "torchsnapshot"}
    for record in report["formats"].values():
        assert record["problems"] == []
        assert record["import_s"] > 0
        assert record["peak_rss_bytes"] > 0
        assert record["snapshot_bytes"] == 256 * 1024
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())
