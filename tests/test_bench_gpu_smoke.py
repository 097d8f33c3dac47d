"""benchmarks/bench_gpu.py where there is no GPU: bad arguments are refused, and without CUDA it
says so and exits 2 without writing a result. Its ``--quick`` run is ``tests/gpu/test_bench_gpu_smoke.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_gpu.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOTKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "gpu.json"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: tests/gpu runs the benchmark")
def test_without_cuda_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--quick", "--dir", str(tmp_path / "scratch"))
    assert proc.returncode == 2, proc.stderr
    assert "CUDA device 0 is not available" in proc.stderr and "Nothing was measured" in proc.stderr
    assert not (tmp_path / "gpu.json").exists() and not (tmp_path / "scratch").exists()


@pytest.mark.parametrize(
    "bad",
    [
        ["--modes", "nope"],
        ["--snapshots", "1"],
        ["--tensor-bytes", "1000"],
        ["--state-bytes", "3MiB"],
        ["--device", "-1"],
    ],
)
def test_bad_arguments_are_refused_before_cuda_is_looked_at(tmp_path: Path, bad: list[str]) -> None:
    proc = _run(tmp_path, *bad)
    assert proc.returncode == 2 and "error:" in proc.stderr, proc.stderr
    assert not (tmp_path / "gpu.json").exists()
