"""Smoke test for benchmarks/stress_kill.py: two kills per mode on a tiny state, every outcome
counted and none wrong. The real run (``--trials 100``) is in docs/reliability.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "stress_kill.py"


@pytest.mark.slow
def test_stress_kill_smoke(tmp_path: Path) -> None:
    out = tmp_path / "kill.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--modes", "take,async_process", "--dir", str(tmp_path / "scratch")]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, f"stress_kill.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "wrong data or unexpected errors: 0" in proc.stdout
    report: dict[str, Any] = json.loads(out.read_text())
    assert set(report["modes"]) == {"take", "async_process"}
    for record in report["modes"].values():
        assert sum(record["counts"].values()) == 2
        assert record["counts"]["wrong"] == 0
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())
