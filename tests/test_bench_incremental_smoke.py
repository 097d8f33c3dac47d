"""Smoke test for benchmarks/bench_incremental.py: tiny sizes, every case, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_incremental_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_incremental.py", tmp_path)
    model = report["model"]
    assert 0.09 < model["changing_fraction"] < 0.11
    steps = report["steps"]
    for run in steps["runs"]["incremental"]:
        assert run["pieces_referenced"] > 0
        assert run["data_bytes"] < model["model_bytes"] / 2
    for run in steps["runs"]["full"]:
        assert run["pieces_referenced"] == 0
        assert run["data_bytes"] >= model["model_bytes"]
    assert steps["time_ratio"] > 0
    changed = report["all_changed"]
    for where in ("disk", "shm"):
        if where in changed:
            runs = changed[where]["runs"]
            assert all(run["pieces_referenced"] == 0 for variant in runs.values() for run in variant)
    assert "disk" in changed
    assert changed["hash_alone"]["xxh3_128_s"] > 0
    assert report["restore"]["verified"] == {"full": True, "incremental": True}
    s3 = report["s3"]
    if "error" in s3:  # SeaweedFS not installed
        pytest.skip(s3["error"])
    assert s3["full"]["puts"] > 0
    assert s3["incremental"]["uploaded_bytes"] < s3["full"]["uploaded_bytes"]
