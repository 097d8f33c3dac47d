"""Smoke test for benchmarks/bench_concurrent_async.py: run it with ``--quick`` and check the JSON.
Nothing about speed is asserted; the staging peak must stay within the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_concurrent_async.py"


@pytest.mark.slow
def test_bench_concurrent_async_smoke(tmp_path: Path) -> None:
    out = tmp_path / "concurrent.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path / "scratch"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_concurrent_async.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "two async_take calls in flight" in proc.stdout
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["benchmark"] == "bench_concurrent_async"
    assert [r["executor"] for r in report["results"]] == ["thread", "process"]
    for result in report["results"]:
        assert result["verified"] is True, result
        assert 0 < result["staging_peak_bytes"] <= report["config"]["state_bytes"], result
        assert result["second_call_s"] > 0
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())


def test_bench_concurrent_async_rejects_bad_arguments(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), "--executors", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert not (tmp_path / "x.json").exists()
