"""Running a benchmark script's ``--quick`` smoke run from a test.

``tests/`` is on ``sys.path``, so a smoke test does ``from _benchmarks import run_quick``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_quick(script: str, tmp_path: Path, *args: str, timeout_s: float = 240) -> tuple[str, dict[str, Any]]:
    """Run ``benchmarks/<script> --quick`` in a fresh interpreter (this checkout's snapshotkit, no
    ``SNAPSHOTKIT_*`` variables), scratch and JSON under ``tmp_path``; fail the test with its output
    unless it exits 0 and leaves its scratch directory empty. Returns its stdout and JSON report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    scratch, out = tmp_path / "scratch", tmp_path / f"{Path(script).stem}.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / script),
        "--quick",
        *args,
        "--dir",
        str(scratch),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert not scratch.exists() or not any(scratch.iterdir()), f"{script} left files in {scratch}"
    return proc.stdout, json.loads(out.read_text())
