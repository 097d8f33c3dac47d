"""Smoke test for benchmarks/bench_should_save.py: two gloo ranks, 20 calls per case, exact counts.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_should_save_smoke(tmp_path: Path) -> None:
    stdout, report = run_quick("bench_should_save.py", tmp_path)
    results = report["results"]
    assert results["ok"] and results["target_met"] is True
    rows = {r["case"]: r for r in results["rows"]}
    assert list(rows) == ["collective", "store/1", "store/10"]
    # 20 calls, scaled to 100: the reproduction of the old should_save makes one all-reduce per call
    before = rows["collective"]
    assert before["collectives_per_100_calls"] == before["group_collectives_per_100_calls"] == 100
    assert rows["collective"]["store_rounds_per_100_calls"] == 0
    assert (rows["store/1"]["collectives_per_100_calls"], rows["store/1"]["store_rounds_per_100_calls"]) == (0, 100)
    assert (rows["store/10"]["collectives_per_100_calls"], rows["store/10"]["store_rounds_per_100_calls"]) == (0, 10)
    assert all(r["saves"] == 0 and r["median_call_s"] > 0 and r["mean_call_s"] > 0 for r in rows.values())
    assert rows["store/10"]["mean_call_over_before"] is not None
    assert "store rounds/100" in stdout and "MET" in stdout
