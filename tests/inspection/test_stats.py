"""Tensor statistics streamed piece by piece (``_inspect/stats.py``) agree with torch on the whole tensor."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._config import Config
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._inspect.stats import StatsAccumulator, stream_stats, tensor_stats
from snapshotkit.manifest import ShardedTensorEntry, TensorEntry

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "v2" / "sharded"


def _streamed(path: Path, key: str, logical_path: str, budget: int, count: int = 5) -> StatsAccumulator:
    entry = Snapshot(str(path)).metadata.manifest[key]
    assert isinstance(entry, (TensorEntry, ShardedTensorEntry))
    with SnapshotReader(str(path), None, Config.resolve(memory_budget_bytes=budget)) as reader:
        return stream_stats(reader, logical_path, entry, count)


def _expect(values: torch.Tensor, stats: StatsAccumulator) -> None:
    flat = values.reshape(-1)
    x = flat.to(torch.complex128).abs() if flat.dtype.is_complex else flat.to(torch.float64)
    finite = x[torch.isfinite(x)]
    found = stats.result()
    assert (found.count, found.finite, found.nan) == (x.numel(), finite.numel(), int(torch.isnan(x).sum()))
    assert found.inf == x.numel() - finite.numel() - found.nan
    assert found.minimum == float(finite.min()) and found.maximum == float(finite.max())
    assert found.mean == pytest.approx(float(finite.mean()), rel=1e-9, abs=1e-12)
    assert found.std == pytest.approx(float(finite.std()), rel=1e-9)
    assert stats.first_values() == [v.item() for v in flat[:5]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int16, torch.bool, torch.complex64])
def test_streamed_stats_match_torch(tmp_path: Path, clean_env: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    clean_env.setenv("SNAPSHOTKIT_CHUNK_BYTES", "1024")  # several pieces
    torch.manual_seed(1)
    values = (torch.randn(33, 31) * 10).to(dtype)
    if dtype.is_floating_point:
        values[3, 4], values[5, 6], values[7, 8] = float("nan"), float("inf"), float("-inf")
    Snapshot.take(str(tmp_path / "s"), {"m": StateDict(t=values)})
    for budget in (64, 1 << 20):  # sub-ranges of pieces, and whole pieces in batches
        _expect(values, _streamed(tmp_path / "s", "0/m/t", "m/t", budget))


def test_sharded_tensor_first_values_follow_the_global_order() -> None:
    expected = torch.arange(4 * 7, dtype=torch.int64).reshape(4, 7) - 10  # sharded by columns
    stats = _streamed(GOLDEN_V2, "0/tables/columns", "tables/columns", budget=16, count=10)
    assert stats.first_values() == expected.reshape(-1)[:10].tolist()
    _expect(expected, _streamed(GOLDEN_V2, "0/tables/columns", "tables/columns", budget=16))


def test_empty_and_zero_dimensional(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "s"), {"m": StateDict(e=torch.empty(0, 3), z=torch.tensor(2.5))})
    empty = _streamed(tmp_path / "s", "0/m/e", "m/e", budget=64).result()
    assert (empty.count, empty.minimum, empty.mean, empty.std) == (0, None, None, None)
    zero = _streamed(tmp_path / "s", "0/m/z", "m/z", budget=64)
    assert (zero.result().count, zero.result().mean, zero.result().std) == (1, 2.5, None)
    assert zero.first_values() == [2.5]


def test_a_tensor_in_memory() -> None:
    quantized = torch.quantize_per_tensor(torch.tensor([-1.0, 0.0, 2.0]), 0.5, 0, torch.qint8)
    stats = tensor_stats(quantized, 2).result()
    assert (stats.minimum, stats.maximum, stats.mean) == (-1.0, 2.0, pytest.approx(1 / 3))
    assert math.isclose(stats.std or 0, float(torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64).std()))
