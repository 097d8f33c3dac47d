"""Smoke test for benchmarks/bench_import.py: tiny sizes, every format, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_import_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_import.py", tmp_path)
    assert set(report["formats"]) == {"torch", "safetensors", "dcp", "torchsnapshot"}
    for record in report["formats"].values():
        assert record["problems"] == []
        assert record["import_s"] > 0
        assert record["peak_rss_bytes"] > 0
        assert record["snapshot_bytes"] == 256 * 1024
