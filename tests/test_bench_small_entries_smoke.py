"""Smoke test for benchmarks/bench_small_entries.py: tiny sizes, every operation, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _benchmarks import REPO, run_quick


@pytest.mark.slow
def test_bench_small_entries_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_small_entries.py", tmp_path)
    assert report["results"], "no operation ran"
    for key, record in report["results"].items():
        assert record["ok"], key
        assert record["median_s"] is not None and record["median_s"] >= 0, key
        assert record["median_cpu_s"] >= 0 and record["median_main_thread_cpu_s"] >= 0, key  # every op, reads too
    assert set(report["ratios"]) >= {"this warm"}
    assert report["results"]["this safetensors_one warm"]["ok"]
    assert report["ratios"]["this warm"]["read_object_speedup_over_safetensors_one"] is not None
    assert report["config"]["manifest_bytes"]["this"] > 0 and report["config"]["format_version"] == {"this": 5}


@pytest.mark.slow
def test_compare_with_measures_the_checkout_it_names(tmp_path: Path) -> None:
    """Each child imports the checkout it was given (issue 24: the harness put the benchmark's own
    checkout first on sys.path, so every comparison timed one code against itself); the benchmark
    stops on a child that imported another."""
    other = tmp_path / "other"
    shutil.copytree(REPO / "snapshotkit", other / "snapshotkit", ignore=shutil.ignore_patterns("__pycache__"))
    _, report = run_quick("bench_small_entries.py", tmp_path, "--compare-with", f"other={other}", "--ops", "take")
    assert report["config"]["checkouts"] == {"this": str(REPO.resolve()), "other": str(other.resolve())}
    assert report["results"]["other take warm"]["ok"]
    assert report["results"]["this take warm"]["ok"]
    assert set(report["config"]["manifest_bytes"]) == {"this", "other"}  # each read a snapshot it took
