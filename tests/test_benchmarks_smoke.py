"""Smoke test for benchmarks/bench_local.py: run it with tiny sizes and check the
JSON is complete.  It never asserts anything about speed -- it only keeps the
script from rotting (API drift, broken imports, crashed child processes)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_local.py"


def _load_script_module() -> Any:
    """bench_local.py as a module (it only runs on ``__main__``), for its system table."""
    spec = importlib.util.spec_from_file_location("bench_local", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# system -> (module, names) that must import for the system to be benchmarked.
PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = _load_script_module()._IMPORTS


def _importable(module: str, names: tuple[str, ...]) -> bool:
    try:
        with warnings.catch_warnings():  # the project's pytest config turns warnings into errors
            warnings.simplefilter("ignore")
            mod = importlib.import_module(module)
    except Exception:
        return False
    return all(hasattr(mod, n) for n in names)


def _expected_ops(system: str, state: str) -> set[str]:
    ops = {"save", "load"}
    if system == "snapshotkit":
        ops.add("load_no_checksum")
        if state == "large":
            ops.add("read_object")
    return ops


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--large-bytes",
        "8MiB",
        "--small-count",
        "200",
        "--repeats",
        "1",
        "--dir",
        str(tmp_path / "scratch"),
        "--out",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_local.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "== small" in proc.stdout, proc.stdout
    assert out.exists()
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _check_op(system: str, state: str, op: str, summary: dict[str, Any]) -> None:
    where = f"{state}/{system}/{op}"
    if summary.get("na"):  # only allowed for the checksum-off restore
        assert op == "load_no_checksum", f"{where}: unexpected n/a: {summary['na']}"
        return
    assert "error" not in summary, f"{where}: {summary['error']}"
    assert summary["n_ok"] == 1, where
    assert summary["median_s"] > 0, where
    assert summary["bandwidth_bytes_per_s"] > 0, where
    assert isinstance(summary["peak_rss_over_baseline_bytes"], int), where
    run = summary["runs"][0]
    assert run["time_s"] > 0, where
    assert run.get("verified", True), where


@pytest.mark.slow
def test_bench_local_smoke(tmp_path: Path) -> None:
    report = _run(tmp_path, "--launcher", "forkserver")

    assert report["read_cache"] in ("cold", "warm")
    machine = report["machine"]
    for key in ("cpu_model", "logical_cpus", "ram_bytes", "kernel", "python", "versions", "scratch_fs"):
        assert machine.get(key), key
    assert set(report["results"]) == {"large", "small"}
    assert report["states"]["large"]["bytes"] == 8 * 1024 * 1024
    assert report["states"]["small"]["tensors"] == 200

    for state, results in report["results"].items():
        assert set(results) == set(PACKAGES), state
        for system, (module, names) in PACKAGES.items():
            if not _importable(module, names):
                assert "skipped" in results[system], f"{system} not importable but not skipped"
                continue
            ops = results[system]
            assert "skipped" not in ops, f"{state}/{system} skipped: {ops.get('skipped')}"
            assert set(ops) == _expected_ops(system, state), (state, system, sorted(ops))
            for op, summary in ops.items():
                _check_op(system, state, op, summary)
        assert state in report["ratios"]

    # No scratch data is left behind.
    scratch = tmp_path / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())


@pytest.mark.slow
def test_bench_local_subprocess_launcher(tmp_path: Path) -> None:
    """The default launcher (re-exec per operation) on the cheapest system."""
    report = _run(tmp_path, "--only", "raw", "--states", "small", "--no-drop-caches")
    assert report["read_cache"] == "warm"
    assert set(report["results"]) == {"small"}
    for op in ("save", "load"):
        _check_op("raw", "small", op, report["results"]["small"]["raw"][op])


@pytest.mark.parametrize("bad", [["--only", "nope"], ["--repeats", "0"], ["--large-bytes", "1KiB"]])
def test_bench_local_rejects_bad_arguments(tmp_path: Path, bad: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert not (tmp_path / "x.json").exists()
