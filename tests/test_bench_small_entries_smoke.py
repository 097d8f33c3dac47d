"""Smoke test for benchmarks/bench_small_entries.py: tiny sizes, every operation, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_small_entries_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_small_entries.py", tmp_path)
    assert report["results"], "no operation ran"
    for key, record in report["results"].items():
        assert record["ok"], key
        assert record["median_s"] is not None and record["median_s"] >= 0, key
    assert set(report["ratios"]) >= {"this warm"}
