from __future__ import annotations

import json

import pytest

from snapshotkit.errors import UnsafeLocationError
from snapshotkit.manifest import (
    DictEntry,
    ListEntry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    SnapshotMetadata,
    TensorEntry,
    TupleEntry,
    validate_location,
)

PIECE = Piece('data/0_00000_ab"c\u00e9', (64, 128), "crc32c:0000abcd")
ENTRIES = {
    "0/sd": DictEntry(("t", 3, "q/x")),
    "0/sd/t": TensorEntry("bfloat16", (2, 0, 3), "raw", (PIECE, Piece("data/x", (0, 0), "crc32c:00000000")), True),
    "0/sd/3": ObjectEntry("builtins.set", PIECE),
    "0/sd/q%2Fx": ListEntry(2),
    "0/sd/q%2Fx/0": PrimitiveEntry.of(float("-inf")),
    "0/sd/q%2Fx/1": TupleEntry(0),
}


def test_fast_json_lines_equal_the_generic_encoding() -> None:
    for entry in ENTRIES.values():
        if isinstance(entry, TensorEntry):
            assert json.loads(entry.to_json_line()) == entry.to_json()
    assert json.loads(PIECE.to_json_line()) == PIECE.to_json()


def test_metadata_round_trips_through_text() -> None:
    metadata = SnapshotMetadata(1, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, dict(ENTRIES))
    text = metadata.to_json_text()
    assert SnapshotMetadata.from_text(text) == metadata
    assert SnapshotMetadata.from_text(text.encode()) == metadata
    assert len(text.splitlines()) == 7 + 1 + len(ENTRIES) + 2


@pytest.mark.parametrize("location", ["../x", "/abs", "a//b", "a/./b", "a/../b", "C:/x", "s3://b/x", "a\\b", "", "a/"])
def test_unsafe_locations(location: str) -> None:
    with pytest.raises(UnsafeLocationError):
        validate_location(location)


def test_safe_location() -> None:
    assert validate_location("data/0_00000_abcd1234") == "data/0_00000_abcd1234"
