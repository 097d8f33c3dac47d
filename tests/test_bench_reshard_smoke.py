"""Smoke test for benchmarks/bench_reshard.py: its ``--quick`` sizes on the local store, then the
table and the JSON. Nothing about speed is asserted; the read volumes are (they are exact, not
timings), so the script cannot silently stop measuring the split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_reshard.py"


@pytest.mark.slow
def test_bench_reshard_smoke(tmp_path: Path) -> None:
    out = tmp_path / "reshard.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--quick", "--stores", "local", "--scratch", str(tmp_path / "scratch")]
    cmd += ["--scenarios", "columns,rows,inproc"]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"bench_reshard.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "take, split over whole (median)" in proc.stdout, proc.stdout

    report: dict[str, Any] = json.loads(out.read_text())
    local = report["stores"]["local"]
    assert local["whole"]["stored_boxes_per_tensor"] == 4
    assert local["split"]["stored_boxes_per_tensor"] == 16  # 4 MiB per rank: 4 sub-boxes of 1 MiB
    for layout in ("whole", "split"):
        for world in (2, 3):
            restored = local[layout][f"restore_{world}"]
            assert restored["exact"] and restored["requests"] > 0
            assert restored["read_over_needed"] >= 1.0
    assert local["whole"]["restore_3"]["read_over_needed"] == pytest.approx(1.5, abs=0.01)
    assert local["split"]["restore_3"]["read_over_needed"] <= 1.2
    # rows: a 128 MiB Shard(0) table, 32 MiB per rank: whole boxes, or 2 column sub-boxes of 16 MiB
    rows = local["rows"]
    assert rows["whole"]["stored_boxes_per_tensor"] == 4
    assert rows["split"]["stored_boxes_per_tensor"] == 8
    for layout in ("whole", "split"):
        for label in ("shard1_2", "shard0_2", "shard0_4"):
            assert rows[layout][f"restore_{label}"]["exact"]
        for label in ("shard0_2", "shard0_4"):
            assert rows[layout][f"restore_{label}"]["read_over_needed"] == pytest.approx(1.0, abs=0.001)
    assert rows["whole"]["restore_shard1_2"]["read_over_needed"] == pytest.approx(2.0, abs=0.001)
    assert rows["split"]["restore_shard1_2"]["max_rank_read_over_needed"] == pytest.approx(1.0, abs=0.001)
    assert set(report["inproc"]) >= {"whole", "split", "split_over_whole_take", "split_over_whole_restore"}
    scratch = tmp_path / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())
