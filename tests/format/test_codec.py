"""``snapshotkit._format.codec``: the manifest's integrity line and strict parsing.

Every manifest written from format version 3 begins with the SHA-256 of the rest of the file;
any changed byte is an error before anything in the manifest is used. A manifest that starts
like JSON is never re-read as YAML, and nothing in the raw bytes can escape as an exception
that is not a :class:`ManifestError`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from _snapshots import MANIFEST, load_manifest_json, reseal_manifest, take_basic, write_manifest_json
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import IntegrityError, ManifestError, ManifestIntegrityError
from snapshotkit.manifest import FORMAT_VERSION, SnapshotMetadata, decode_document, encode_document

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture(scope="module")
def manifest_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("codec") / "snap"
    take_basic(path)
    data = (path / MANIFEST).read_bytes()
    return data


def test_a_take_writes_the_integrity_line(manifest_bytes: bytes) -> None:
    first, _, body = manifest_bytes.partition(b"\n")
    assert first == b'{"integrity": "sha256:' + hashlib.sha256(body).hexdigest().encode() + b'",'
    assert json.loads(manifest_bytes)["format_version"] == FORMAT_VERSION == 5


def test_encode_then_decode_is_the_identity() -> None:
    document = {"format": "snapshotkit", "nested": {"a": [1, 2.5, None, True, "\u00e9"]}, "n": 10**30}
    data = encode_document(document)
    assert decode_document(data) == document
    assert decode_document(encode_document({**document, "integrity": "sha256:stale"})) == document


def test_decode_removes_the_integrity_member(manifest_bytes: bytes) -> None:
    document = decode_document(manifest_bytes)
    assert "integrity" not in document
    assert document == {k: v for k, v in json.loads(manifest_bytes).items() if k != "integrity"}
    assert decode_document(encode_document(document)) == document


def test_every_single_byte_change_is_refused(manifest_bytes: bytes) -> None:
    """Exhaustive: each byte of a real manifest, changed in one bit, and replaced by another digit."""
    for index in range(len(manifest_bytes)):
        for mutant in {manifest_bytes[index] ^ 0x01, manifest_bytes[index] ^ 0x80, ord("7")} - {manifest_bytes[index]}:
            data = manifest_bytes[:index] + bytes([mutant]) + manifest_bytes[index + 1 :]
            with pytest.raises(ManifestError):
                SnapshotMetadata.from_text(data)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_damage_is_refused(manifest_bytes: bytes, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(manifest_bytes) - 1))
    length = data.draw(st.integers(0, 8))
    replacement = data.draw(st.binary(min_size=0, max_size=8))
    damaged = manifest_bytes[:start] + replacement + manifest_bytes[start + length :]
    if damaged == manifest_bytes:
        return
    with pytest.raises(ManifestError):
        SnapshotMetadata.from_text(damaged)


def test_damage_is_an_integrity_error_naming_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    text = (path / MANIFEST).read_bytes()
    (path / MANIFEST).write_bytes(text.replace(b'"value":3', b'"value":4'))
    with pytest.raises(ManifestIntegrityError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    assert isinstance(info.value, IntegrityError)
    assert isinstance(info.value, ManifestError)
    message = str(info.value)
    assert MANIFEST in message and "integrity" in message and "earlier snapshot" in message


def test_an_independent_writer_following_the_spec_passes_the_check(tmp_path: Path) -> None:
    """docs/format.md 2.1 is enough to write a manifest: tests/_snapshots.reseal_manifest uses only it."""
    path = tmp_path / "snap"
    take_basic(path)
    text = (path / MANIFEST).read_bytes()
    (path / MANIFEST).write_bytes(text.replace(b'"value":3', b'"value":4'))
    reseal_manifest(path)
    restored = StateDict()
    Snapshot(str(path)).restore({"extras": restored})
    assert restored["step"] == 4


def test_version_3_without_the_integrity_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    (path / MANIFEST).write_text(json.dumps(document))
    with pytest.raises(ManifestIntegrityError, match="integrity line"):
        _ = Snapshot(str(path)).metadata


def test_integrity_member_elsewhere_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["format_version"] = 1
    document["integrity"] = "sha256:" + "0" * 64  # last, not the first line
    (path / MANIFEST).write_text(json.dumps(document))
    with pytest.raises(ManifestIntegrityError, match="not its first line"):
        _ = Snapshot(str(path)).metadata


@pytest.mark.parametrize(
    "first_line",
    [
        b'{"integrity": "sha256:' + b"A" * 64 + b'",',  # upper case
        b'{"integrity": "sha256:' + b"0" * 63 + b'",',  # short
        b'{"integrity":"sha256:' + b"0" * 64 + b'",',  # other spacing
        b'{"integrity": "md5:' + b"0" * 32 + b'",',  # other algorithm
    ],
)
def test_malformed_integrity_line_is_refused(manifest_bytes: bytes, first_line: bytes) -> None:
    body = manifest_bytes.partition(b"\n")[2]
    with pytest.raises(ManifestIntegrityError):
        decode_document(first_line + b"\n" + body)


def test_json_is_never_reread_as_yaml() -> None:
    # Valid YAML (a flow mapping with an unquoted value), invalid JSON: a damaged legacy manifest.
    legacy = b'{"format": "snapshotkit", "format_version": 1, "world_size": 1, "manifest": {}, "x": yes}'
    with pytest.raises(ManifestError, match="not valid JSON"):
        decode_document(legacy)


def test_a_legacy_yaml_manifest_still_reads() -> None:
    legacy = b"format: snapshotkit\nformat_version: 1\nworld_size: 1\nmanifest: {}\n"
    assert decode_document(legacy) == {"format": "snapshotkit", "format_version": 1, "world_size": 1, "manifest": {}}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
        (b'{"format": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"format: snapshotkit\n7: seven\n", "not a string"),
        (b"- " * 50_000 + b"x\n", "neither JSON nor YAML"),
        (b"a: " + b"[" * 100_000, "neither JSON nor YAML"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b'{"a": 1, "a": 2}', "more than once"),
    ],
    ids=["deep-json", "huge-integer", "yaml-integer-key", "deep-yaml-block", "deep-yaml-flow", "not-utf8", "duplicate"],
)
def test_hostile_bytes_raise_manifest_error_only(data: bytes, named: str) -> None:
    with pytest.raises(ManifestError, match=named):
        decode_document(data)


def _sealed(body: bytes) -> bytes:
    return b'{"integrity": "sha256:' + hashlib.sha256(body).hexdigest().encode() + b'",\n' + body


@pytest.mark.parametrize(
    "body",
    [
        b'"format": "snapshotkit", "format_version": 3, "deep": ' + b'{"d": ' * 100_000 + b"{}" + b"}" * 100_000 + b"}",
        b'"format": "snapshotkit", "format_version": 3, "n": ' + b"7" * 5000 + b"}",
        b'"format": "snapshotkit", "format_version": 3, "world_size": 1, "snapshotkit_version": "x", '
        b'"torch_version": "x", "created_at": "x", "manifest": {"0/a": {"kind": "list", "length": 1000000000}}}',
    ],
    ids=["deep", "huge-integer", "huge-list"],
)
def test_sealed_hostile_documents_raise_manifest_error_only(body: bytes) -> None:
    with pytest.raises(ManifestError):
        SnapshotMetadata.from_text(_sealed(body))


def test_a_yaml_integer_manifest_key_is_a_manifest_error() -> None:
    legacy = (
        b"format: snapshotkit\nformat_version: 1\nworld_size: 1\nsnapshotkit_version: x\ntorch_version: x\n"
        b"created_at: x\nmanifest:\n  7: {kind: list, length: 0}\n"
    )
    with pytest.raises(ManifestError, match="'<rank>/<logical path>'"):
        SnapshotMetadata.from_text(legacy)


def test_encode_document_argument_errors() -> None:
    with pytest.raises(TypeError):
        encode_document([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        encode_document({})
    with pytest.raises(ValueError):
        encode_document({"x": float("nan")})
    with pytest.raises(ValueError, match="surrogate"):
        encode_document({"x": "\ud800"})
    deep: dict[str, object] = {}
    node = deep
    for _ in range(5000):
        node["d"] = node = {}
    with pytest.raises(ValueError, match="deep"):
        encode_document(deep)
    with pytest.raises(TypeError):
        decode_document("text")  # type: ignore[arg-type]


def test_write_manifest_json_helper_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    write_manifest_json(path, document)
    assert load_manifest_json(path) == document
    assert Snapshot(str(path)).metadata.format_version == 4  # load_manifest_json rewrote it as version 4
