"""Smoke test for benchmarks/bench_convert.py: tiny sizes, every case, a complete JSON, outputs verified.
It asserts nothing about speed or memory; the real run is in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_convert.py"


@pytest.mark.slow
def test_bench_convert_smoke(tmp_path: Path) -> None:
    out = tmp_path / "convert.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path / "scratch"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"bench_convert.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"raw_copy", "safetensors", "torch", "dcp"}
    for case, summary in report["results"].items():
        assert summary["n_ok"] == 1, (case, summary.get("error"))
        assert summary["median_s"] > 0
        assert summary["output_bytes"] >= report["data_bytes"]
        if case != "raw_copy":
            assert all(run["verified"] for run in summary["runs"]), case
    assert set(report["targets"]) == {
        "safetensors_speed_vs_raw_copy_at_least_0.8",
        "safetensors_peak_rss_within_budget_plus_10pct",
    }
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())
