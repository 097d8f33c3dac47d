"""Checking a copy's bytes as they arrive (``_tier/arrival.py``), against a real snapshot's manifest.

However a data object's bytes are cut into chunks, an intact copy checks clean and a flipped byte
is pinned to exactly the pieces that hold it; a data object that is short, missing or never fed
is a problem, as :func:`~snapshotkit.verify.verify_snapshot` would report it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.checksum import content_hash, crc32c, format_checksum
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.pieces import METADATA_FILENAME, Piece
from snapshotkit._inspect.pieces import StoredPiece, stored_pieces
from snapshotkit._tier.arrival import ArrivalCheck, FileCheck
from snapshotkit.verify import VerifyProblem

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[SnapshotMetadata, dict[str, bytes]]:
    """A snapshot of one rank (tensors of several sizes, an empty one, tied weights, an object):
    its manifest and every data object's bytes."""
    path = tmp_path_factory.mktemp("arrival") / "snap"
    generator = torch.Generator().manual_seed(0)
    tied = torch.rand(300, generator=generator)
    state = {
        "a": torch.rand(1000, generator=generator),
        "b": torch.arange(77, dtype=torch.int16),
        "empty": torch.zeros(0),
        "tied1": tied,
        "tied2": tied,
        "note": {"lr": 0.1, "name": "x" * 50},
    }
    Snapshot.take(str(path), {"s": StateDict(state)})
    metadata = SnapshotMetadata.from_text((path / METADATA_FILENAME).read_bytes())
    files = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    del files[METADATA_FILENAME]
    return metadata, files


def _feed(check: ArrivalCheck, files: dict[str, bytes], cuts: list[int]) -> list[VerifyProblem]:
    """Every data object's bytes, cut at ``cuts`` (taken modulo each object's size)."""
    for location, data in files.items():
        file = check.file(location)
        points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
        for start, end in itertools.pairwise(points):
            file.update(memoryview(data)[start:end])
        file.close()
    return check.finish()


@FAST
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_an_intact_copy_checks_clean_however_its_bytes_are_cut(
    snapshot: tuple[SnapshotMetadata, dict[str, bytes]], cuts: list[int]
) -> None:
    metadata, files = snapshot
    check = ArrivalCheck(metadata, {k: len(v) for k, v in files.items()})
    assert _feed(check, files, cuts) == []
    assert not check.bases


@FAST
@given(data=st.data(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
def test_a_flipped_byte_is_pinned_to_the_pieces_holding_it(
    snapshot: tuple[SnapshotMetadata, dict[str, bytes]], data: st.DataObject, cuts: list[int]
) -> None:
    metadata, files = snapshot
    held = [s.piece for s in stored_pieces(metadata) if s.piece.nbytes]
    piece = data.draw(st.sampled_from(held))
    at = data.draw(st.integers(min_value=piece.byte_range[0], max_value=piece.byte_range[1] - 1))
    damaged = dict(files)
    raw = bytearray(files[piece.location])
    raw[at] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    damaged[piece.location] = bytes(raw)
    problems = _feed(ArrivalCheck(metadata, {k: len(v) for k, v in files.items()}), damaged, cuts)
    covering = [p for p in held if p.location == piece.location and p.byte_range[0] <= at < p.byte_range[1]]
    assert [(p.location, p.kind) for p in problems] == [(piece.location, "checksum")] * len(covering)
    assert all("checksum mismatch for logical path" in p.message for p in problems)


def test_short_missing_and_unfed_data_objects_are_problems(
    snapshot: tuple[SnapshotMetadata, dict[str, bytes]],
) -> None:
    metadata, files = snapshot
    first, *rest = sorted(files)
    # the sender lists the first object shorter than its last piece, and not the others at all
    check = ArrivalCheck(metadata, {first: len(files[first]) - 1})
    kinds = {(p.location, p.kind) for p in check.problems}
    assert (first, "truncated") in kinds and all((location, "missing") in kinds for location in rest)
    assert ArrivalCheck(metadata, {}).problems and {p.kind for p in ArrivalCheck(metadata, {}).problems} == {"missing"}
    # listed at full size but the bytes stop short: the pieces not whole are truncated
    check = ArrivalCheck(metadata, {k: len(v) for k, v in files.items()})
    file = check.file(first)
    file.update(memoryview(files[first])[:-1])
    file.close()
    assert [p.kind for p in check.problems] == ["truncated"]
    # listed, never fed (the sender stopped early): every piece is missing
    check = ArrivalCheck(metadata, {k: len(v) for k, v in files.items()})
    problems = check.finish()
    assert [p.kind for p in problems] == ["missing"] * len(stored_pieces(metadata))


def test_a_checksum_that_matches_with_a_wrong_hash_is_a_hash_problem() -> None:
    data = b"0123456789" * 10
    good = content_hash(data[:40])
    pieces = [
        Piece("d", (0, 40), format_checksum(crc32c(data[:40])), good),
        Piece("d", (20, 100), format_checksum(crc32c(data[20:])), "xxh3-128:" + "0" * 32),  # overlaps the first
        Piece("d", (100, 100), format_checksum(0)),  # empty, at the very end
    ]
    problems: list[VerifyProblem] = []
    file = FileCheck("d", [(StoredPiece(p, (f"0/p{i}",)), f"p{i}") for i, p in enumerate(pieces)], problems)
    for start in range(0, 100, 7):
        file.update(memoryview(data)[start : start + 7])
    file.close()
    assert [(p.kind, "'p1'" in p.message) for p in problems] == [("hash", True)]
