"""Smoke test for benchmarks/bench_async.py: run it with ``--quick`` (a 32 MiB state, a tiny MLP,
60 steps, runs forked from a server) and check the table and the JSON. Nothing about speed is
asserted -- it only keeps the script from rotting (API drift in async_take or DCP's async_save,
broken imports, crashed runs, snapshots that no longer restore bit-exactly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_async.py"
MODES = ("none", "thread", "process", "thread_warm", "process_warm", "dcp", "dcp_reuse")
SNAPSHOT_MODES = MODES[1:]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "async.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--dir", str(tmp_path / "scratch"), "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    return proc, out


@pytest.mark.slow
def test_bench_async_smoke(tmp_path: Path) -> None:
    proc, out = _run(tmp_path)
    assert proc.returncode == 0, f"bench_async.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for heading in ("== time blocked in the snapshot call", "== training loop", "-- targets --"):
        assert heading in proc.stdout, proc.stdout
    assert out.exists()

    report: dict[str, Any] = json.loads(out.read_text())
    assert report["benchmark"] == "bench_async"
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions"):
        assert report["machine"].get(key), key
    config = report["config"]
    assert config["state_bytes"] == 32 * 1024 * 1024
    assert config["modes"] == list(MODES)
    assert config["steps"] >= config["every"] * config["snapshots"]
    assert set(report["activity"]) == {"start", "end"}

    memcpy = report["memcpy"]
    assert memcpy["n_ok"] == 1
    assert memcpy["prealloc_median_s"] > 0
    assert memcpy["fresh_median_s"] > 0
    assert memcpy["bytes"] > config["state_bytes"]  # the big state plus the model and optimizer

    results = report["results"]
    assert set(results) == set(MODES)
    assert results["none"]["n_ok"] == 1
    assert results["none"]["loop_s"] > 0
    for mode in SNAPSHOT_MODES:
        s = results[mode]
        assert "error" not in s, f"{mode}: {s['error']}"
        assert s["n_ok"] == 1, mode
        assert s["verified"] is True, mode
        run = s["runs"][0]
        assert len(run["calls"]) == config["snapshots"], mode
        assert all(c["call_s"] > 0 for c in run["calls"]), mode
        assert s["first_call_median_s"] > 0, mode
        assert s["later_call_median_s"] > 0, mode
        assert s["loop_excl_blocked_s"] > 0, mode
        assert s["loop_excl_blocked_s"] <= s["loop_incl_blocked_s"] <= s["loop_s"] + 1e-9, mode
    for mode in ("thread_warm", "process_warm"):
        assert results[mode]["prepare_async_median_s"] > 0, mode  # the warm-up ran, before the loop

    ratios = report["ratios"]
    for mode in SNAPSHOT_MODES:
        for key in ("later_call_over_memcpy", "slowdown_excl_blocked", "slowdown_incl_blocked"):
            assert isinstance(ratios[mode][key], float), (mode, key)
    targets = ratios["targets"]
    for key in ("process_blocked_met", "process_slowdown_met", "process_better_than_thread"):
        assert isinstance(targets[key], bool), key

    # The runs clean up after themselves.
    scratch = tmp_path / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())


@pytest.mark.parametrize("bad", [["--modes", "nope"], ["--repeats", "0"], ["--tensor-bytes", "1000"]])
def test_bench_async_rejects_bad_arguments(tmp_path: Path, bad: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert not (tmp_path / "x.json").exists()
