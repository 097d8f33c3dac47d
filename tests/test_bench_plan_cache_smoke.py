"""Smoke test for benchmarks/bench_plan_cache.py: tiny sizes, both parts, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_plan_cache_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_plan_cache.py", tmp_path)
    single, ranks = report["results"]["single"], report["results"]["ranks"]
    assert single["ok"] and single["full"]["takes"] == single["reused"]["takes"] == 2
    assert single["plan_ratio"] is not None and single["digest_s"] is not None
    assert [take["reused"] for take in ranks["per_take"]] == [[False], [True], [True], [True]]
    assert all(take["collectives"] == [1] for take in ranks["per_take"][1:])
