"""Smoke test for benchmarks/bench_dist.py: two gloo ranks, a 64 MiB model, a 16 MiB DTensor and a
small simulated planning run, then check the table and the JSON. Nothing about speed is asserted --
it only keeps the script from rotting (planner API drift, broken rank launching, snapshots that no
longer reshard)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_dist.py"


@pytest.mark.slow
def test_bench_dist_smoke(tmp_path: Path) -> None:
    out = tmp_path / "dist.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--ranks", "2", "--model-bytes", "64MiB", "--dtensor-bytes", "16MiB"]
    cmd += ["--planning-ranks", "8,16", "--planning-entries", "100", "--scratch", str(tmp_path / "scratch")]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_dist.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for line in ("planning (one core):", "replicated DDP model 64.00 MiB on 2 ranks", "reshard 2 -> 1 ranks"):
        assert line in proc.stdout, proc.stdout

    report: dict[str, Any] = json.loads(out.read_text())
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    rows = report["planning"]["rows"]
    assert [r["ranks"] for r in rows] == [8, 16]
    assert all(r["manifest_entries"] > 0 and r["total_seconds"] >= 0 for r in rows)
    replicated = report["replicated"]
    assert replicated["written_over_model"] == pytest.approx(1.0, abs=0.01)  # each byte written once
    assert len(replicated["share_per_rank"]) == 2
    assert replicated["take_seconds_multi_rank"] > 0
    reshard = report["reshard"]
    for dim in (0, 1):
        (rank,) = reshard[f"shard{dim}"]["per_rank"]
        assert rank["read_bytes"] >= rank["needed_bytes"] > 0
    assert reshard["shard0"]["max_read_over_needed"] <= 1.1

    # The snapshots are removed with the scratch directory.
    scratch = tmp_path / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())
