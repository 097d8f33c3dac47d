"""Smoke test for benchmarks/bench_plan_scale.py: a 64-rank world, every part, a complete JSON.
It asserts nothing about speed; the real run is in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from _benchmarks import run_quick


@pytest.mark.slow
def test_bench_plan_scale_smoke(tmp_path: Path) -> None:
    _, report = run_quick("bench_plan_scale.py", tmp_path)
    world, take = report["world"], report["take"]
    assert (world["ranks"], world["entries"]) == (64, 100)
    assert take["decide"]["cpu_s"] > 0 and take["decide"]["traced_peak_bytes"] > 0
    assert take["decide"]["replicated"] == world["replicated"]
    # every rank describes its state alike (DTensors by their grid): headers plus two parts, once
    infos = take["infos"]
    assert infos["distinct_parts"] == 2
    assert infos["header_bytes_per_rank"] == 64 * world["ranks"]
    assert (
        infos["header_bytes_per_rank"]
        < infos["all_gather_bytes_per_rank"]
        < 2 * infos["pickled_rank_info_bytes"] + infos["header_bytes_per_rank"]
    )
    # each fully sharded tensor has a box per rank, each TP tensor one per TP rank
    assert take["decide"]["distinct_boxes"] == world["fsdp"] * world["ranks"] + world["tp"] * 8
    assert all(plan["consistent"] for plan in take["plan_rank"])  # plan_rank writes what decide gave the rank
    assert 1.0 <= take["balance"]["max_over_mean"] < 1.5
    assert report["merge"]["manifest_entries"] > 0
    reshard = report["reshard"]
    assert reshard["new_ranks"] == 32
    for rank in reshard["per_rank"]:
        assert rank["read_bytes"] == rank["needed_bytes"]  # row-aligned boxes: exactly the needed pieces
