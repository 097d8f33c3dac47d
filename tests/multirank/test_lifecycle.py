"""``metadata=``, ``include=``/``exclude=`` and the restore report with several real gloo ranks:
rank 0's metadata is stored, each rank applies its own patterns, each rank gets its own report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import RestoreReport, Snapshot, StateDict
from snapshotkit.errors import ConfigError, RankFailedError

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _take_and_restore(rank: int, world: int, path: str) -> dict[str, Any]:
    progress = StateDict(step=100 + rank, weights=torch.full((3,), float(rank)), cache=f"rank {rank}")
    Snapshot.take(
        path,
        {"progress": progress},
        metadata={"written_by": rank, "tags": [f"rank-{rank}"]},
        exclude=["progress/cache"] if rank == 1 else None,
    )
    destination = StateDict(step=-1, weights=torch.zeros(3), cache="current")
    report = Snapshot(path).restore({"progress": destination}, strict=False)
    return {
        "report": report,
        "restored": {
            "step": destination["step"],
            "weights": destination["weights"].tolist(),
            "cache": destination["cache"],
        },
        "user_metadata": Snapshot(path).metadata.user_metadata,
    }


def test_rank_zero_metadata_own_patterns_and_own_reports(tmp_path: Path) -> None:
    results = run_ranks(2, _take_and_restore, str(tmp_path / "snap"), timeout=120)
    for result in results:
        assert result["user_metadata"] == {"written_by": 0, "tags": ["rank-0"]}
    assert results[0]["report"] == RestoreReport()
    assert results[0]["restored"] == {"step": 100, "weights": [0.0, 0.0, 0.0], "cache": "rank 0"}
    assert results[1]["report"] == RestoreReport(missing_keys=("progress/cache",))
    assert results[1]["restored"] == {"step": 101, "weights": [1.0, 1.0, 1.0], "cache": "current"}
    assert "1/progress/cache" not in Snapshot(str(tmp_path / "snap")).get_manifest()


def _select_nothing_on_one_rank(rank: int, world: int, path: str) -> str:
    try:
        Snapshot.take(path, {"progress": StateDict(step=rank)}, include=["nothing/**"] if rank == 1 else None)
    except (ConfigError, RankFailedError) as exc:
        return type(exc).__name__
    return "committed"


def test_patterns_selecting_nothing_on_one_rank_fail_every_rank_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    assert run_ranks(2, _select_nothing_on_one_rank, str(path), timeout=120) == ["RankFailedError", "ConfigError"]
    assert not path.exists()
