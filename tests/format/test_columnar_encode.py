"""The column-by-column encoder of format 5's ``entries`` (issue 27, a first take of many small
tensors) against the entry-by-entry one it replaced (``tests/format/_old_encode.py``, kept
verbatim): the same member for random manifests, the fast paths for checksums and hashes and
their fallbacks alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from format import _old_encode
from snapshotkit._format.columnar_encode import encode_entries
from snapshotkit._format.entries import DictEntry, Entry, ObjectEntry, PrimitiveEntry, TensorEntry
from snapshotkit._format.pieces import Piece

SETTINGS = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

checksums = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda value: f"crc32c:{value:08x}"),  # what a take writes
    st.integers(0, 2**32 - 1).map(lambda value: f"crc32c:{value:x}"),  # fewer digits: the fallback
    st.integers(0, 2**32 - 1).map(lambda value: f"crc32c:{value:08X}"),
)
hashes = st.one_of(
    st.none(),  # a piece without a content hash: its tensor is a row
    st.binary(min_size=16, max_size=16).map(lambda digest: f"xxh3-128:{digest.hex()}"),
    st.binary(min_size=16, max_size=16).map(lambda digest: f"xxh3-128:{digest.hex().upper()}"),
)
pieces = st.builds(
    lambda location, start, length, checksum, digest, base: Piece(
        location, (start, start + length), checksum, digest, base
    ),
    st.sampled_from(["data/0_00000_ab", "data/0_00001_ab", "data/1_00000_ab"]),
    st.integers(0, 2**40),
    st.integers(0, 2**20),
    checksums,
    hashes,
    st.sampled_from([None, None, "../base", "../older"]),
)
tensors = st.builds(
    TensorEntry,
    st.sampled_from(["float32", "int64", "bfloat16"]),
    st.lists(st.integers(0, 5), max_size=3).map(tuple),
    st.sampled_from(["raw", "torch_save"]),
    st.lists(pieces, max_size=3).map(tuple),
    st.booleans(),
)
entries = st.one_of(
    tensors,
    tensors,
    st.builds(PrimitiveEntry.of, st.integers(-5, 5), st.booleans()),
    st.builds(ObjectEntry, st.just("builtins.dict"), pieces, st.booleans()),
    st.just(DictEntry(())),
)
keys = st.tuples(st.integers(0, 3), st.text("abc/._", min_size=1, max_size=6)).map(lambda t: f"{t[0]}/m/{t[1]}")


@SETTINGS
@given(manifest=st.dictionaries(keys, entries, max_size=12))
def test_the_same_member_as_the_entry_by_entry_encoder(manifest: dict[str, Entry]) -> None:
    new = encode_entries(manifest)
    assert new == _old_encode.encode_entries(manifest)
    assert json.dumps(new) == json.dumps(_old_encode.encode_entries(manifest))  # the same bytes written


@pytest.mark.parametrize("key", ["m/x", "01/m/x", "-1/m/x", "/m/x"])
def test_a_key_without_a_rank_is_refused_as_before(key: str) -> None:
    manifest: dict[str, Entry] = {"0/m": DictEntry(()), key: PrimitiveEntry.of(1)}
    with pytest.raises(ValueError, match="is not '<rank>/<logical path>'"):
        _old_encode.encode_entries(manifest)
    with pytest.raises(ValueError, match="is not '<rank>/<logical path>'"):
        encode_entries(manifest)
