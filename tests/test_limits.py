"""What take accepts, restore returns; what cannot be stored, take refuses before writing anything,
naming the logical path (deep nesting, huge ints, strings and keys that are not valid UTF-8); and a
version-5 manifest's counts cannot make a reader allocate more than its bytes hold."""

from __future__ import annotations

import base64
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _snapshots import MANIFEST, depth_of, nested

from snapshotkit import Snapshot, StateDict
from snapshotkit._plan.flatten import MAX_INT_BITS, MAX_NESTING_DEPTH
from snapshotkit.errors import InvalidAppStateError, ManifestError, UnsupportedValueError
from snapshotkit.manifest import Piece, SnapshotMetadata, TensorEntry, decode_document, encode_document

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.mark.parametrize("depth", [500, MAX_NESTING_DEPTH - 1])
def test_deeply_nested_state_that_take_accepts_is_restored(tmp_path: Path, depth: int) -> None:
    # Before: a dict nested 500 deep was taken, then restore raised RecursionError.
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(tree=nested(depth))})
    fresh = StateDict()
    Snapshot(str(tmp_path / "snap")).restore({"s": fresh})
    assert depth_of(fresh["tree"]) == depth
    assert depth_of(Snapshot(str(tmp_path / "snap")).read_object("s/tree")) == depth


def test_nesting_deeper_than_the_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedValueError, match=f"more than {MAX_NESTING_DEPTH} levels.*'s/tree/d/d"):
        Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(tree=nested(MAX_NESTING_DEPTH + 5))})
    assert not (tmp_path / "snap").exists()


def test_keys_that_are_not_utf8_and_the_largest_ints_round_trip(tmp_path: Path) -> None:
    # Before: a dict key with a lone surrogate failed the commit with a raw UnicodeEncodeError.
    largest = 2**MAX_INT_BITS - 1
    state = {
        "largest": largest,
        "negative": -largest,
        "largest_key": {largest: "value", 1: "one"},
        "odd_key": {"bad \udcff key": [1, 2]},
    }
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(**state)})
    fresh = StateDict()
    Snapshot(str(tmp_path / "snap")).restore({"s": fresh})
    assert dict(fresh) == state
    (tmp_path / "snap" / MANIFEST).read_bytes().decode("utf-8")  # valid UTF-8 throughout


@pytest.mark.parametrize(
    ("value", "where"),
    [(10**5000, "s/big"), ({10**5000: 1}, "s/big"), ([1, -(2**MAX_INT_BITS)], "s/big/1")],
    ids=["leaf", "key", "negative-in-list"],
)
def test_ints_beyond_the_limit_are_refused_before_anything_is_written(tmp_path: Path, value: Any, where: str) -> None:
    # Before: a 10**5000 leaf failed in the commit with a raw ValueError (Python's 4,300-digit
    # int<->str limit), after the data objects were written; a 10**5000 key inside take.
    with pytest.raises(UnsupportedValueError, match=f"'{where}' has .* bits.*as a str"):
        Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(big=value)})
    assert not (tmp_path / "snap").exists()


def test_app_state_key_that_is_not_utf8_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(InvalidAppStateError, match="lone surrogate"):
        Snapshot.take(str(tmp_path / "snap"), {"bad \udcff": StateDict(x=1)})
    assert not (tmp_path / "snap").exists()


def test_version_5_counts_never_allocate_past_the_manifest_bytes() -> None:
    """Counts in a version-5 manifest (piece and dimension counts of ``2**32 - 1`` per entry) are
    refused by the length of the columns they describe, before anything is allocated by them: the
    decode's peak allocation stays a small multiple of the manifest's size (docs/format.md 11.4)."""
    piece = Piece("data/0_00000", (0, 4), "crc32c:00000000", "xxh3-128:" + "00" * 16)
    manifest: dict[str, Any] = {f"0/s/{i}": TensorEntry("float32", (1,), "raw", (piece,)) for i in range(2000)}
    document = decode_document(SnapshotMetadata(5, "x", "y", "z", 1, manifest, snapshot_id="3" * 32).to_bytes())
    for column in ("piece_count", "ndim"):
        hostile = {**document, "entries": dict(document["entries"])}
        hostile["entries"][column] = base64.b64encode(np.full(2000, 2**32 - 1, "<u4").tobytes()).decode()
        data = encode_document(hostile)
        tracemalloc.start()
        try:
            with pytest.raises(ManifestError, match=r"holds .* bytes where .* are needed"):
                SnapshotMetadata.from_text(data)
            peak_bytes = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak_bytes < 20 * len(data), (column, peak_bytes, len(data))
