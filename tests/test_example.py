"""End-to-end check of examples/train_resume.py: crash, resume in a fresh process, compare bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_resume.py"


def test_train_resume_example_is_bit_exact_and_leaves_nothing(tmp_path: Path) -> None:
    # No --workdir, as in the README: the example makes its own temp work dir and removes it.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["TMPDIR"] = str(tmp_path)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # as on a fresh machine: torch would make it in TMPDIR
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--steps",
            "24",
            "--snapshot-every",
            "5",
            "--crash-at",
            "17",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # Snapshots at 5, 10, 15; the crash leaves an incomplete step_17, which the manager removes,
    # so the resume is from step 15; run C saves 20 and the final 24, and keeps the last three.
    assert "removed the incomplete snapshot" in output and "step_17" in output, output
    assert "restored step 15" in output, output
    assert "snapshots kept: [15, 20, 24]" in output, output
    assert "resumed losses match the uninterrupted run bit for bit for all 9 steps after step 15" in output, output
    assert "FAIL" not in output, output
    assert "PASSED" in output, output
    assert f"[main] workdir {tmp_path.resolve()}" in output, output
    assert "[main] removed" in output, output
    assert list(tmp_path.iterdir()) == [], output
