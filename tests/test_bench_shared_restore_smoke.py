"""Smoke test for benchmarks/bench_shared_restore.py: two gloo ranks, a 16 MiB replicated state, one
repetition per mode on a local directory, then check the table and the JSON. Nothing about speed is
asserted -- it only keeps the script from rotting; the byte counts it reports are checked, since
they are what the benchmark is for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_shared_restore.py"


@pytest.mark.slow
def test_bench_shared_restore_smoke(tmp_path: Path) -> None:
    out = tmp_path / "shared.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--ranks", "2", "--state-bytes", "16MiB", "--reps", "1", "--stores", "local"]
    cmd += ["--scratch", str(tmp_path / "scratch"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_shared_restore.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "local: replicated state 16.00 MiB restored by 2 gloo ranks" in proc.stdout, proc.stdout

    report: dict[str, Any] = json.loads(out.read_text())
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    (row,) = report["stores"]
    assert row["shared"]["read_over_state"] <= 1.1
    assert row["shared"]["received_bytes"] == row["state_bytes"]  # the other rank's half
    assert row["every_rank"]["read_over_state"] >= 2.0
    assert row["every_rank"]["received_bytes"] == 0
    assert row["shared_over_every_rank_seconds"] > 0
    scratch = tmp_path / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())
