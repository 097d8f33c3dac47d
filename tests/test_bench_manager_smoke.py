"""Smoke test for benchmarks/bench_manager.py: tiny sizes, every case and store, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_manager.py"


@pytest.mark.slow
def test_bench_manager_smoke(tmp_path: Path) -> None:
    out = tmp_path / "manager.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path / "scratch"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"bench_manager.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert report["loop"]["exact"] is True
    assert report["loop"]["kept"] == [80, 90, 100]
    assert report["save_cost"]["bare_take_s"] > 0
    assert set(report["restore_latest"]) == {"local", "s3"}
    for record in report["restore_latest"].values():
        assert record["snapshots"] == 5
        assert record["restore_latest_s"] > 0
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())
