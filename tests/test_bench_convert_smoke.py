"""Smoke test for benchmarks/bench_convert.py: tiny sizes, every case, a complete JSON, outputs verified.
It asserts nothing about speed or memory; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_convert_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_convert.py", tmp_path)
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
