"""Smoke test for benchmarks/bench_manager.py: tiny sizes, every case and store, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_manager_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_manager.py", tmp_path)
    assert report["loop"]["exact"] is True
    assert report["loop"]["kept"] == [80, 90, 100]
    assert report["save_cost"]["bare_take_s"] > 0
    assert set(report["restore_latest"]) == {"local", "s3"}
    for record in report["restore_latest"].values():
        assert record["snapshots"] == 5
        assert record["restore_latest_s"] > 0
