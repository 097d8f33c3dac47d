"""Decoding rules of format version 4 (docs/format.md sections 2.2, 3.1, 4.4, 8.1 and 9):
``snapshot_id``, ``bases`` and a piece's ``hash`` and ``base``.

Each malformed manifest is sealed with a valid integrity line (``snapshotkit.manifest.encode_document``),
so what is refused is the member itself, never the digest. Documents with bases and hashes
round-trip through text unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit._format.checksum import content_hash
from snapshotkit._format.entries import pieces_of
from snapshotkit._take.reuse import build_reuse_index
from snapshotkit.errors import ManifestError, ManifestIntegrityError, UnsupportedFormatVersionError
from snapshotkit.manifest import (
    FORMAT_VERSION,
    DictEntry,
    ObjectEntry,
    Piece,
    SnapshotMetadata,
    TensorEntry,
    decode_document,
    encode_document,
)

INCREMENTAL = Path(__file__).resolve().parent.parent / "golden" / "v4" / "incremental"
OWN_ID = "0123456789abcdef0123456789abcdef"
BASE_ID = "fedcba9876543210fedcba9876543210"
HASH = "xxh3-128:" + "ab" * 16


def test_format_version_is_5_and_version_4_is_still_read() -> None:
    assert FORMAT_VERSION == 5  # version 4 is what the golden snapshots and these tests read


def test_the_hash_is_xxh3_128_as_the_spec_states() -> None:
    """The test vectors of docs/format.md section 4.4.4."""
    assert xxhash.xxh3_128_hexdigest(b"123456789") == "33119477ede5dcd5e9716427681d5860"
    assert xxhash.xxh3_128_hexdigest(b"") == "99aa06d3014798d86001c324468d497f"
    assert content_hash(b"123456789") == "xxh3-128:33119477ede5dcd5e9716427681d5860"
    assert content_hash(memoryview(b"123456789")) == content_hash(bytearray(b"123456789"))
    digest = xxhash.xxh3_128(b"123456789")
    assert digest.hexdigest() == f"{digest.intdigest():032x}"  # the canonical (big-endian) form


# --------------------------------------------------------------------------------------------
# malformed version-4 manifests


def golden_document() -> dict[str, Any]:
    """The decoded manifest of the golden incremental snapshot: ids, bases, hashes, references."""
    return decode_document((INCREMENTAL / ".snapshot_metadata").read_bytes())


def _first_piece(document: dict[str, Any], referenced: bool) -> dict[str, Any]:
    for entry in document["manifest"].values():
        for piece in entry.get("pieces", [entry["piece"]] if "piece" in entry else []):
            if ("base" in piece) == referenced:
                return piece  # type: ignore[no-any-return]
    raise AssertionError("no such piece")


def _header(name: str, value: Any = None, delete: bool = False) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        if delete:
            del document[name]
        else:
            document[name] = value

    return mutate


def _rename_base(location: str) -> Callable[[dict[str, Any]], None]:
    """The header lists the base as ``location`` (the references keep ``../base``)."""

    def mutate(document: dict[str, Any]) -> None:
        document["bases"] = {location: document["bases"].pop("../base")}

    return mutate


def _move_base(location: str) -> Callable[[dict[str, Any]], None]:
    """Header and every reference name the base ``location``."""

    def mutate(document: dict[str, Any]) -> None:
        document["bases"] = {location: document["bases"].pop("../base")}
        for entry in document["manifest"].values():
            for piece in entry.get("pieces", [entry["piece"]] if "piece" in entry else []):
                if "base" in piece:
                    piece["base"] = location

    return mutate


def _piece(member: str, value: Any = None, referenced: bool = True, delete: bool = False) -> Callable[..., None]:
    def mutate(document: dict[str, Any]) -> None:
        piece = _first_piece(document, referenced)
        if delete:
            del piece[member]
        else:
            piece[member] = value

    return mutate


def _own_id_as_base_id(document: dict[str, Any]) -> None:
    document["bases"]["../base"] = document["snapshot_id"]


def _as_version_3(keep_hashes: bool, keep_bases: bool) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        document["format_version"] = 3
        for entry in document["manifest"].values():
            for piece in entry.get("pieces", [entry["piece"]] if "piece" in entry else []):
                if not keep_hashes:
                    piece.pop("hash")
                if not keep_bases:
                    piece.pop("base", None)

    return mutate


BAD_LOCATIONS = ["../../x", "../", "/x", "..", "../a/../b", "x/y", "base", "./base", "../base/", "../.", "../a//b"]

MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "snapshot-id-missing": _header("snapshot_id", delete=True),
    "snapshot-id-null": _header("snapshot_id", None),
    "snapshot-id-uppercase": _header("snapshot_id", OWN_ID.upper()),
    "snapshot-id-31-digits": _header("snapshot_id", OWN_ID[:31]),
    "snapshot-id-33-digits": _header("snapshot_id", OWN_ID + "0"),
    "snapshot-id-uuid-text": _header("snapshot_id", "01234567-89ab-cdef-0123-456789abcdef"),
    "snapshot-id-integer": _header("snapshot_id", 1234),
    "snapshot-id-not-hex": _header("snapshot_id", "g" * 32),
    "bases-list": _header("bases", ["../base"]),
    "bases-string": _header("bases", "../base"),
    "bases-null": _header("bases", None),
    "base-id-equals-own-id": _own_id_as_base_id,
    "base-id-uppercase": _header("bases", {"../base": BASE_ID.upper()}),
    "base-id-integer": _header("bases", {"../base": 7}),
    "base-id-object": _header("bases", {"../base": {"id": BASE_ID}}),
    **{f"bases-key-{location!r}": _rename_base(location) for location in BAD_LOCATIONS},
    **{f"bases-and-pieces-{location!r}": _move_base(location) for location in BAD_LOCATIONS},
    "piece-base-not-in-header": _piece("base", "../other"),
    "piece-base-without-any-bases": _header("bases", delete=True),
    "piece-base-null": _piece("base", None),
    "piece-base-integer": _piece("base", 3),
    "piece-base-list": _piece("base", ["../base"]),
    "hash-uppercase": _piece("hash", HASH.upper().replace("XXH3", "xxh3"), referenced=False),
    "hash-other-algorithm": _piece("hash", "xxh3-64:" + "ab" * 8, referenced=False),
    "hash-short": _piece("hash", HASH[:-1], referenced=False),
    "hash-long": _piece("hash", HASH + "0", referenced=False),
    "hash-no-prefix": _piece("hash", "ab" * 16, referenced=False),
    "hash-sha256": _piece("hash", "sha256:" + "ab" * 32, referenced=False),
    "hash-integer": _piece("hash", 12345, referenced=False),
    "hash-list": _piece("hash", [], referenced=False),
    "hash-null": _piece("hash", None, referenced=False),
    "version-3-with-hashes": _as_version_3(keep_hashes=True, keep_bases=False),
    "version-3-with-bases": _as_version_3(keep_hashes=False, keep_bases=True),
    "version-3-with-both": _as_version_3(keep_hashes=True, keep_bases=True),
}


@pytest.mark.parametrize("mutate", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_version_4_members_raise_manifest_error(mutate: Callable[[dict[str, Any]], None]) -> None:
    document = golden_document()
    assert SnapshotMetadata.from_text(encode_document(document)).bases  # untouched, it reads
    mutate(document)
    data = encode_document(document)  # a valid integrity line: the member itself must be refused
    with pytest.raises(ManifestError) as info:
        SnapshotMetadata.from_text(data)
    assert not isinstance(info.value, (UnsupportedFormatVersionError, ManifestIntegrityError))
    assert str(info.value)


def test_messages_name_the_offending_value() -> None:
    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (_header("snapshot_id", "nope"), "'nope'"),
        (_header("bases", [1]), "'bases'"),
        (_rename_base("../../x"), "'../../x'"),
        (_own_id_as_base_id, "own id"),
        (_piece("base", "../other"), "'../other'"),
        (_piece("hash", "xxh3-128:zz", referenced=False), "'xxh3-128:zz'"),
        (_as_version_3(keep_hashes=True, keep_bases=False), "format version 4"),
    ]
    for mutate, named in cases:
        document = golden_document()
        mutate(document)
        with pytest.raises(ManifestError) as info:
            SnapshotMetadata.from_text(encode_document(document))
        assert named in str(info.value), str(info.value)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_snapshot_id_and_bases_before_version_4_are_unknown_members_and_ignored(version: int) -> None:
    document = golden_document()
    _as_version_3(keep_hashes=False, keep_bases=False)(document)
    document["format_version"] = version
    document["snapshot_id"] = "not an id"
    document["bases"] = ["not", "an", "object"]
    data = encode_document(document) if version >= 3 else json.dumps(document).encode()
    metadata = SnapshotMetadata.from_text(data)
    assert (metadata.snapshot_id, metadata.bases) == (None, {})


def test_a_version_4_manifest_without_bases_or_references_reads() -> None:
    document = golden_document()
    del document["bases"]
    for entry in document["manifest"].values():
        for piece in entry.get("pieces", [entry["piece"]] if "piece" in entry else []):
            piece.pop("base", None)
    metadata = SnapshotMetadata.from_text(encode_document(document))
    assert metadata.bases == {}
    assert metadata.snapshot_id == document["snapshot_id"]


def test_hashes_are_optional_in_version_4() -> None:
    """A version-4 piece without a hash reads (its hash None, the rest of it as written); a writer
    simply cannot reference it later: an incremental take on it finds nothing to match."""
    document = golden_document()
    _piece("hash", referenced=False, delete=True)(document)
    metadata = SnapshotMetadata.from_text(encode_document(document))
    golden = SnapshotMetadata.from_text((INCREMENTAL / ".snapshot_metadata").read_bytes())

    def every_piece(of: SnapshotMetadata) -> list[Piece]:
        return [piece for _, entry in sorted(of.manifest.items()) for piece in pieces_of(entry)]

    changed = [(was, now) for was, now in zip(every_piece(golden), every_piece(metadata), strict=True) if was != now]
    assert len(changed) == 1, changed  # only the piece whose hash was removed
    was, now = changed[0]
    assert was.hash is not None and was.base is None
    assert now == dataclasses.replace(was, hash=None)

    def offered(of: SnapshotMetadata) -> set[tuple[str, tuple[int, int]]]:
        index = build_reuse_index(str(INCREMENTAL.parent / "next"), str(INCREMENTAL), of, min_bytes=0)
        return {(piece.location, piece.byte_range) for piece in index.by_hash.values()}

    assert (was.location, was.byte_range) in offered(golden)
    assert (was.location, was.byte_range) not in offered(metadata)


def test_unused_bases_read() -> None:
    """A listed base no piece references is allowed (a reader never opens it)."""
    document = golden_document()
    document["bases"]["../unused"] = BASE_ID
    assert "../unused" in SnapshotMetadata.from_text(encode_document(document)).bases


def test_a_newer_version_is_written_by_a_newer_snapshotkit() -> None:
    document = golden_document()
    document["format_version"] = FORMAT_VERSION + 1
    document["snapshotkit_version"] = "9.0.0"
    document["snapshot_id"] = "a future id"  # nothing else is looked at
    with pytest.raises(UnsupportedFormatVersionError) as info:
        SnapshotMetadata.from_text(encode_document(document))
    message = str(info.value)
    assert "written by a newer snapshotkit" in message
    assert f"format version {FORMAT_VERSION + 1}" in message
    assert "'9.0.0'" in message
    assert "pip install -U snapshotkit" in message


def test_writing_needs_a_snapshot_id_from_version_4_and_version_4_for_bases() -> None:
    with pytest.raises(ValueError, match="snapshot_id"):
        SnapshotMetadata(4, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, {}).to_bytes()
    with pytest.raises(ValueError, match="format version 4"):
        SnapshotMetadata(3, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, {}, bases={"../a": BASE_ID}).to_bytes()


# --------------------------------------------------------------------------------------------
# round trip


HEX = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
NAMES = st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=8).filter(
    lambda name: name not in (".", "..")
)
LOCATIONS = st.lists(NAMES, min_size=1, max_size=3).map("/".join).filter(lambda loc: loc != ".snapshot_metadata")
BASE_LOCATIONS = st.lists(NAMES, min_size=1, max_size=2).map(lambda parts: "../" + "/".join(parts))


@st.composite
def metadatas(draw: st.DrawFn) -> SnapshotMetadata:
    """A version-4 document whose pieces carry random hashes and references to random bases."""
    own = draw(HEX)
    bases = draw(st.dictionaries(BASE_LOCATIONS, HEX.filter(lambda h: h != own), max_size=3))
    base_choice = st.sampled_from([None, *bases])
    raw_pieces = draw(
        st.lists(
            st.builds(
                lambda location, start, length, crc, digest, base: Piece(
                    location, (start, start + length), f"crc32c:{crc:08x}", digest and f"xxh3-128:{digest}", base
                ),
                LOCATIONS,
                st.integers(0, 2**40),
                st.integers(0, 2**20),
                st.integers(0, 2**32 - 1),
                st.none() | HEX,
                base_choice,
            ),
            max_size=8,
        )
    )
    manifest: dict[str, Any] = {"0/sd": DictEntry((*(f"o{i}" for i in range(len(raw_pieces))), "t"))}
    for index, piece in enumerate(raw_pieces):
        manifest[f"0/sd/o{index}"] = ObjectEntry("builtins.set", piece, draw(st.booleans()))
    manifest["0/sd/t"] = TensorEntry(
        "uint8", (sum(p.nbytes for p in raw_pieces),), "raw", tuple(raw_pieces), draw(st.booleans())
    )
    return SnapshotMetadata(
        4,
        "0.1.0",
        "2.13.0",
        "2026-11-25T00:00:00+00:00",
        1,
        manifest,
        draw(st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)),
        own,
        bases,
    )


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(metadata=metadatas())
def test_documents_with_bases_and_hashes_round_trip(metadata: SnapshotMetadata) -> None:
    data = metadata.to_bytes()
    decoded = SnapshotMetadata.from_text(data)
    assert decoded == metadata
    assert decoded.to_bytes() == data
    assert list(decoded.bases) == list(metadata.bases)
    document = json.loads(data)
    assert document["snapshot_id"] == metadata.snapshot_id
    assert ("bases" in document) == bool(metadata.bases)
    assert list(document).index("snapshot_id") == list(document).index("world_size") + 1


@settings(max_examples=100, deadline=None)
@given(
    piece=st.builds(
        Piece,
        LOCATIONS,
        st.tuples(st.just(0), st.integers(0, 99)),
        st.just("crc32c:00000000"),
        st.none() | HEX.map(lambda h: f"xxh3-128:{h}"),
        st.none() | BASE_LOCATIONS,
    )
)
def test_a_piece_line_equals_its_generic_encoding(piece: Piece) -> None:
    assert json.loads(piece.to_json_line()) == piece.to_json()
    assert Piece.from_json("0/x", copy.deepcopy(piece.to_json())) == piece
    assert ("hash" in piece.to_json()) == (piece.hash is not None)
    assert ("base" in piece.to_json()) == (piece.base is not None)
