"""Smoke test for benchmarks/bench_gpu.py: its ``--quick`` run on a GPU (64 MiB state, every
mode), so the script cannot rot. Nothing about speed is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick

MODES = ["memcpy", "thread", "process", "dcp_pinned", "dcp_pinned_shared", "dcp_async_staging"]


@pytest.mark.slow
def test_bench_gpu_quick(tmp_path: Path) -> None:
    stdout, report = run_quick("bench_gpu.py", tmp_path, timeout_s=300)
    assert "== time blocked (s)" in stdout
    assert report["benchmark"] == "bench_gpu" and report["gpu"]["name"]
    assert report["config"]["modes"] == MODES
    for mode in MODES:
        result = report["results"][mode]
        assert "error" not in result, (mode, result.get("error"))
        assert result["verified"] is True, mode
        assert len(result["calls"]) == report["config"]["snapshots"] == 2, mode
        assert result["later_blocked_median_s"] > 0, mode
        assert isinstance(report["ratios"][mode]["later_blocked_over_memcpy"], float), mode
