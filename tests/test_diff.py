"""``snapshotkit.diff.diff_snapshots``: paths added, removed and changed, values compared under the budget."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
from _snapshots import MANIFEST, flip_byte, piece_of, reseal_manifest

from snapshotkit import Snapshot, StateDict
from snapshotkit._inspect import compare
from snapshotkit.diff import DiffReport, PathChange, diff_snapshots
from snapshotkit.errors import ChecksumMismatchError, ConfigError, SnapshotNotFoundError
from snapshotkit.manifest import Piece, ShardedTensorEntry

GOLDEN_V2 = Path(__file__).resolve().parent / "golden" / "v2" / "sharded"


def _state(**changes: Any) -> dict[str, StateDict]:
    values: dict[str, Any] = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "ints": torch.arange(5),
        "nan": torch.tensor([1.0, float("nan"), float("inf")]),
        "step": 7,
        "lr": 0.1,
        "tags": {"a", "b"},
        "empty": {},
    }
    values.update(changes)
    return {"s": StateDict({k: v for k, v in values.items() if v is not None})}


def _take(path: Path, **changes: Any) -> str:
    Snapshot.take(str(path), _state(**changes))
    return str(path)


def test_identical_snapshots(tmp_path: Path) -> None:
    a, b = _take(tmp_path / "a"), _take(tmp_path / "b")
    report = diff_snapshots(a, b)
    assert isinstance(report, DiffReport)
    assert report.identical and report.compared == 7  # NaN equals NaN, objects by their bytes
    assert (report.a, report.b, report.added, report.removed, report.changed) == (a, b, (), (), ())


def test_every_kind_of_change(tmp_path: Path) -> None:
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w[1, 2] += 0.5
    w[2, 3] -= 2.0
    a = _take(tmp_path / "a")
    b = _take(
        tmp_path / "b",
        w=w,
        ints=torch.arange(5, dtype=torch.int32),  # dtype
        nan=torch.ones(4),  # shape
        step=8,
        tags={"a", "c"},
        empty=[],  # kind: dict -> list
        lr=None,  # removed
        extra=torch.zeros(2),  # added
    )
    report = diff_snapshots(a, b)
    assert not report.identical
    assert report.added == ("s/extra",) and report.removed == ("s/lr",)
    changes = {c.logical_path: c for c in report.changed}
    assert {path: c.what for path, c in changes.items()} == {
        "s/w": "values",
        "s/ints": "dtype",
        "s/nan": "shape",
        "s/step": "value",
        "s/tags": "value",
        "s/empty": "kind",
    }
    assert changes["s/w"] == PathChange("s/w", "values", "float32 [3, 4]", "float32 [3, 4]", 2.0, 2)
    assert (changes["s/ints"].a, changes["s/ints"].b) == ("int64 [5]", "int32 [5]")
    assert (changes["s/step"].a, changes["s/step"].b) == ("primitive int 7", "primitive int 8")
    assert changes["s/tags"].a.startswith("object builtins.set")


def test_tolerances(tmp_path: Path) -> None:
    a = _take(tmp_path / "a")
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1e-3
    b = _take(tmp_path / "b", w=w, lr=0.1 + 1e-9)
    strict = diff_snapshots(a, b)
    assert [(c.logical_path, c.mismatched) for c in strict.changed] == [("s/w", 12), ("s/lr", None)]
    assert strict.changed[0].max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert diff_snapshots(a, b, atol=2e-3).identical
    assert diff_snapshots(a, b, rtol=1e-3).changed[0].mismatched == 1  # |b| * rtol < 1e-3 only at 0 + 1e-3
    with pytest.raises(ConfigError, match="atol"):
        diff_snapshots(a, b, atol=-1)
    with pytest.raises(ConfigError, match="rtol"):
        diff_snapshots(a, b, rtol=float("nan"))


def _count_merges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Record the piece-by-piece comparisons: (logical path, pieces of A, pieces of B)."""
    seen: list[tuple[str, int, int]] = []
    merge = compare._ValueComparer._merge

    def spy(self: Any, path: str, dtype: Any, pieces_a: Any, pieces_b: Any, accumulator: Any) -> None:
        seen.append((path, len(pieces_a), len(pieces_b)))
        merge(self, path, dtype, pieces_a, pieces_b, accumulator)

    monkeypatch.setattr(compare._ValueComparer, "_merge", spy)
    return seen


def test_large_tensors_are_compared_piece_by_piece(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    big = torch.randn(20_000)
    clean_env.setenv("SNAPSHOTKIT_CHUNK_BYTES", "12000")
    Snapshot.take(str(tmp_path / "a"), {"m": StateDict(big=big, i=torch.arange(3000))})
    changed = big.clone()
    changed[[5, 3001, 19_999]] += torch.tensor([1.0, -3.0, 0.25])
    clean_env.setenv("SNAPSHOTKIT_CHUNK_BYTES", "28000")  # B's pieces end elsewhere than A's
    Snapshot.take(str(tmp_path / "b"), {"m": StateDict(big=changed, i=torch.arange(3000))})
    assert len(Snapshot(str(tmp_path / "a")).metadata.manifest["0/m/big"].pieces) == 7  # type: ignore[union-attr]
    whole = diff_snapshots(str(tmp_path / "a"), str(tmp_path / "b"))
    merges = _count_merges(monkeypatch)
    streamed = diff_snapshots(str(tmp_path / "a"), str(tmp_path / "b"), memory_budget_bytes=30_000)
    assert merges == [("m/big", 7, 3), ("m/i", 2, 1)]  # one piece of each side in memory at a time
    assert whole.changed == streamed.changed
    largest = float((changed.double() - big.double()).abs().max())  # differences are taken in float64
    assert [(c.logical_path, c.mismatched, c.max_abs_diff) for c in streamed.changed] == [("m/big", 3, largest)]


def _rewrite_piece(snapshot_dir: Path, piece: Piece, data: bytes) -> None:
    """Store ``data`` as ``piece``'s bytes, with a matching checksum in a resealed manifest."""
    target = snapshot_dir / piece.location
    content = bytearray(target.read_bytes())
    content[piece.byte_range[0] : piece.byte_range[1]] = data
    target.write_bytes(bytes(content))
    manifest = snapshot_dir / MANIFEST
    new_checksum = f"crc32c:{crc32c.crc32c(data):08x}"
    text = manifest.read_bytes()
    manifest.write_bytes(text.replace(piece.checksum.encode(), new_checksum.encode()))
    if text.startswith(b'{"integrity"'):  # format version 3; the golden v2 snapshot has no integrity line
        reseal_manifest(snapshot_dir)


def test_sharded_tensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "golden"
    shutil.copytree(GOLDEN_V2, copy)
    merges = _count_merges(monkeypatch)
    for budget in (None, 16):
        report = diff_snapshots(str(GOLDEN_V2), str(copy), memory_budget_bytes=budget)
        assert report.identical and report.compared == 9
    assert merges.count(("0/tables/columns", 2, 2)) == 2  # shard by shard under the small budget
    entry = Snapshot(str(copy)).metadata.manifest["0/tables/columns"]
    assert isinstance(entry, ShardedTensorEntry)
    second = entry.shards[1]
    piece = second.pieces[0]
    stored = (copy / piece.location).read_bytes()[piece.byte_range[0] : piece.byte_range[1]]
    changed = torch.frombuffer(bytearray(stored), dtype=torch.int64).clone()
    changed[0] += 100
    _rewrite_piece(copy, piece, changed.numpy().tobytes())
    for budget in (None, 16):
        report = diff_snapshots(str(GOLDEN_V2), str(copy), memory_budget_bytes=budget)
        assert [(c.logical_path, c.what, c.mismatched, c.max_abs_diff) for c in report.changed] == [
            ("0/tables/columns", "values", 1, 100.0)
        ]


def test_paths_carry_ranks_when_a_side_has_many(tmp_path: Path) -> None:
    a = _take(tmp_path / "a")
    report = diff_snapshots(a, str(GOLDEN_V2))
    assert "0/s/w" in report.removed and "1/progress/tag" in report.added


def test_corrupt_values_raise(tmp_path: Path) -> None:
    a, b = _take(tmp_path / "a"), _take(tmp_path / "b")
    location, start, _ = piece_of(tmp_path / "b", "s/w")
    flip_byte(location, start)
    with pytest.raises(ChecksumMismatchError, match="s/w"):
        diff_snapshots(a, b)
    with pytest.raises(SnapshotNotFoundError):
        diff_snapshots(a, str(tmp_path / "absent"))
