"""Smoke test for benchmarks/stress_kill.py: two kills per mode on a tiny state, every outcome
counted and none wrong. The real run (``--trials 100``) is in docs/reliability.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_stress_kill_smoke(tmp_path: Path) -> None:
    stdout, report = run_quick("stress_kill.py", tmp_path, "--modes", "take,async_process")
    assert "wrong data or unexpected errors: 0" in stdout
    assert set(report["modes"]) == {"take", "async_process"}
    for record in report["modes"].values():
        assert sum(record["counts"].values()) == 2
        assert record["counts"]["wrong"] == 0
