"""``snapshotkit.verify.verify_snapshot``: every piece read and checked, every problem listed by logical path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from _snapshots import MANIFEST, flip_byte, piece_of, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import IncompleteSnapshotError, SnapshotNotFoundError
from snapshotkit.verify import VerifyProblem, VerifyReport, verify_snapshot

GOLDEN_V2 = Path(__file__).resolve().parent / "golden" / "v2" / "sharded"


def _chunked_state() -> dict[str, StateDict]:
    """Tensors stored in several pieces and data objects (with the chunk and object sizes below)."""
    return {
        "a": StateDict(big=torch.arange(4096, dtype=torch.float32), small=torch.ones(3)),
        "b": StateDict(other=torch.arange(2048, dtype=torch.int64), name="run", obj={1, 2}),
    }


@pytest.fixture
def chunked(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> Path:
    clean_env.setenv("SNAPSHOTKIT_CHUNK_BYTES", "4096")
    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", "8192")
    path = tmp_path / "snap"
    Snapshot.take(str(path), _chunked_state())
    return path


def _stored_bytes(path: Path) -> int:
    manifest = Snapshot(str(path)).metadata.manifest
    seen = set()
    for entry in manifest.values():
        for piece in getattr(entry, "pieces", ()) or ((entry.piece,) if hasattr(entry, "piece") else ()):
            seen.add((piece.location, piece.byte_range))
    return sum(end - start for _, (start, end) in seen)


def test_a_healthy_snapshot_verifies(chunked: Path) -> None:
    seen: list[tuple[int, int]] = []
    report = verify_snapshot(str(chunked), memory_budget_bytes=4096, progress=lambda d, t: seen.append((d, t)))
    assert isinstance(report, VerifyReport)
    assert report.ok and report.problems == ()
    assert report.bytes_checked == _stored_bytes(chunked) > 3 * 4096
    assert report.pieces_checked >= 8  # the tensors were chunked
    assert seen and seen[-1] == (report.bytes_checked, report.bytes_checked)


def test_every_problem_is_listed_not_just_the_first(chunked: Path) -> None:
    data = sorted((chunked / "data").iterdir())
    assert len(data) >= 3
    big, big_start, _ = piece_of(chunked, "a/big")
    flip_byte(big, big_start + 5)  # the first piece of a/big
    other, _, other_end = piece_of(chunked, "b/other")
    flip_byte(other, other_end - 1)  # the first piece of b/other, in another object
    report = verify_snapshot(str(chunked), memory_budget_bytes=4096)
    assert not report.ok
    assert {(p.logical_path, p.kind) for p in report.problems} == {("a/big", "checksum"), ("b/other", "checksum")}
    for problem in report.problems:
        assert isinstance(problem, VerifyProblem)
        logical_path, location, kind, message = problem  # a plain tuple, too
        assert location.startswith("data/") and kind == "checksum"
        assert logical_path in message and "checksum mismatch" in message
        # A report says what is wrong, not how to read the damaged bytes anyway (a restore's advice).
        assert "verify_checksums" not in message and message.endswith("The snapshot is corrupt")
    assert report.bytes_checked == _stored_bytes(chunked)


def _pieces(path: Path, logical_path: str) -> list[tuple[Path, int, int]]:
    entry = Snapshot(str(path)).metadata.manifest[f"0/{logical_path}"]
    return [(path / p.location, *p.byte_range) for p in entry.pieces]  # type: ignore[union-attr]


def test_missing_and_truncated_data_objects(chunked: Path) -> None:
    big = _pieces(chunked, "a/big")
    other = _pieces(chunked, "b/other")
    missing = big[-1][0]  # a/big's last data object holds nothing else
    truncated, start, _ = other[1]  # b/other's second piece starts another data object
    assert missing != truncated and missing != other[0][0]
    missing.unlink()
    truncated.write_bytes(truncated.read_bytes()[: start + 8])
    report = verify_snapshot(str(chunked), memory_budget_bytes=4096)
    found = sorted((p.logical_path, p.kind, p.location) for p in report.problems)
    relative = lambda f: f.relative_to(chunked).as_posix()  # noqa: E731
    assert found == [
        ("a/big", "missing", relative(missing)),
        ("a/big", "missing", relative(missing)),
        ("b/other", "truncated", relative(truncated)),
        ("b/other", "truncated", relative(truncated)),
    ]  # two pieces each; everything else verified
    assert report.bytes_checked == _stored_bytes(chunked) - 4 * 4096


def test_a_piece_shared_by_tied_weights_is_reported_for_each_path(tmp_path: Path) -> None:
    weight = torch.arange(6, dtype=torch.float32)
    Snapshot.take(str(tmp_path / "s"), {"m": StateDict(encoder=weight, decoder=weight)})
    location, start, _ = piece_of(tmp_path / "s", "m/encoder")
    flip_byte(location, start)
    report = verify_snapshot(str(tmp_path / "s"))
    assert report.pieces_checked == 1
    assert sorted(p.logical_path for p in report.problems) == ["m/decoder", "m/encoder"]


def test_a_damaged_manifest_is_one_problem(tmp_path: Path) -> None:
    take_basic(tmp_path / "s")
    flip_byte(tmp_path / "s" / MANIFEST, 200)
    report = verify_snapshot(str(tmp_path / "s"))
    assert [(p.logical_path, p.location, p.kind) for p in report.problems] == [("", MANIFEST, "manifest")]
    assert report.pieces_checked == 0


def test_nothing_there_raises(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError, match="no snapshot at"):
        verify_snapshot(str(tmp_path / "absent"))
    take_basic(tmp_path / "s")
    (tmp_path / "s" / MANIFEST).unlink()
    with pytest.raises(IncompleteSnapshotError):
        verify_snapshot(str(tmp_path / "s"))


def test_many_ranks_name_rank_local_paths_with_their_rank(tmp_path: Path) -> None:
    copy = tmp_path / "golden"
    shutil.copytree(GOLDEN_V2, copy)
    assert verify_snapshot(str(copy)).ok
    manifest = Snapshot(str(copy)).metadata.manifest
    piece = manifest["0/tables/rows"].shards[1].pieces[0]  # type: ignore[union-attr]
    flip_byte(copy / piece.location, piece.byte_range[0])
    problems = verify_snapshot(str(copy), memory_budget_bytes=16).problems
    assert [(p.logical_path, p.kind) for p in problems] == [("0/tables/rows", "checksum")]
