"""Smoke test for benchmarks/plots.py: it draws the committed results into a temporary folder,
and skips a plot whose results file is absent. It asserts nothing about how the plots look."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "plots.py"
RESULTS = REPO / "benchmarks" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(results: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(results), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _script_constant(name: str) -> str:
    """The results file plots.py reads for one plot (a module-level string constant)."""
    for line in SCRIPT.read_text().splitlines():
        if line.startswith(f"{name} = "):
            return str(ast.literal_eval(line.split("=", 1)[1].strip()))
    raise AssertionError(f"plots.py defines no {name}")


@pytest.mark.slow
def test_plots_render_every_committed_result(tmp_path: Path) -> None:
    proc = _run(RESULTS, tmp_path / "img")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert written == ["async_blocked.png", "local_throughput.png", "shared_restore_reads.png"]
    for name in written:
        assert (tmp_path / "img" / name).read_bytes().startswith(PNG_SIGNATURE)
    # The committed pictures are the ones these results draw (no stale plot in the docs).
    for name in written:
        assert (REPO / "docs" / "img" / name).is_file(), f"docs/img/{name} is not committed"


def test_a_plot_without_its_results_is_skipped(tmp_path: Path) -> None:
    results = tmp_path / "results"
    async_results = results / _script_constant("ASYNC_RESULTS")
    async_results.parent.mkdir(parents=True)
    shutil.copy(RESULTS / _script_constant("ASYNC_RESULTS"), async_results)
    proc = _run(results, tmp_path / "img")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [p.name for p in (tmp_path / "img").iterdir()] == ["async_blocked.png"]
    assert "skipped local_throughput.png" in proc.stderr
    assert "skipped shared_restore_reads.png" in proc.stderr
