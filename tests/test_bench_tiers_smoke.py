"""Smoke test for benchmarks/bench_tiers.py: 4 gloo ranks as 2 nodes, 8 MiB each, every part,
then check the table and the JSON. Nothing about speed is asserted -- it only keeps the script
from rotting (tier API drift, broken rank launching, restores that no longer come from peers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _benchmarks import REPO, run_quick

from snapshotkit.testing._servers import weed_binary


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiers_smoke(tmp_path: Path) -> None:
    stdout, report = run_quick("bench_tiers.py", tmp_path, timeout_s=280)
    for line in ("-- blocked per save", "-- recovery of node B", "incremental durable take from memory"):
        assert line in stdout, stdout
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    assert report["activity"]["start"]["loadavg"]

    blocked = report["blocked"]
    assert blocked["verified"] is True
    assert [r["rank"] for r in blocked["per_rank"]] == [0, 1, 2, 3]
    for row in blocked["per_rank"]:
        assert len(row["local_save_s"]) == len(row["async_take_s"]) == len(row["memcpy_s"]) == 3
        assert row["median_local_save_s"] > 0 and row["median_async_take_s"] > 0 and row["median_memcpy_s"] > 0
        assert row["local_over_async_take"] > 0

    recovery = report["recovery"]
    sources = recovery["sources"]
    s3 = weed_binary() is not None
    assert set(sources) == ({"peers", "s3", "disk"} if s3 else {"peers", "disk"})
    assert sources["peers"]["reported_sources"] == ["local", "local", "peer", "peer"]
    for source in sources.values():
        assert source["verified"] is True
        assert source["steps"] == [4]
        assert source["median_wall_s"] > 0
    durable = recovery["durable_bytes"]
    assert 0 < durable["disk_step_4_bytes"] < durable["disk_step_2_bytes"]
    if s3:
        assert 0 < durable["s3_step_4"]["uploaded_bytes"] < durable["s3_step_2"]["uploaded_bytes"]
        assert durable["s3_step_4"]["puts"] >= 4  # a data object per rank, and the manifest


def test_bench_tiers_rejects_bad_arguments(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "bench_tiers.py"
    for bad in (["--ranks", "3"], ["--saves", "1"], ["--parts", "nope"], ["--tensor-bytes", "2GiB"]):
        cmd = [sys.executable, str(script), "--dir", str(tmp_path / "s"), "--out", str(tmp_path / "x.json")]
        proc = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, bad
        assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiers_local_dir(tmp_path: Path) -> None:
    """``--local-dir``: the local roots live in a fresh directory under it, removed at the end."""
    local = tmp_path / "local-parent"
    stdout, report = run_quick("bench_tiers.py", tmp_path, "--parts", "recovery", "--local-dir", str(local),
                               timeout_s=280)  # fmt: skip
    config = report["config"]
    assert Path(config["local_root_parent"]).parent.parent == local
    assert config["local_fs"] and f"local roots: {config['local_root_parent']}/" in stdout
    assert report["footprint"]["disk_bytes"] < report["footprint"]["local_bytes"]  # the local roots counted apart
    recovery = report["recovery"]
    assert recovery["local_bytes_after_setup"] > 0
    assert recovery["sources"]["peers"]["reported_sources"] == ["local", "local", "peer", "peer"]
    assert all(s["verified"] for s in recovery["sources"].values())
    assert not any(local.iterdir()), "the local roots' directory was left behind"
