"""The manifest codec (``snapshotkit.manifest``: ``_format/entries`` and ``_format/document``).

Entries and the document round-trip through text; every malformed or unsafe manifest a reader
may meet is refused with a :class:`ManifestError` that names the offending member, before any
data object is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from _snapshots import (
    MANIFEST,
    Net,
    load_manifest_json,
    reseal_manifest,
    rewrite_as_v4,
    take_basic,
    write_manifest_json,
)

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ManifestError, UnsafeLocationError, UnsupportedFormatVersionError
from snapshotkit.manifest import (
    FORMAT_VERSION,
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
from snapshotkit.storage import FSStoragePlugin

pytestmark = pytest.mark.usefixtures("clean_env")

PIECE = Piece('data/0_00000_ab"c\u00e9', (64, 128), "crc32c:0000abcd")
ENTRIES = {
    "0/sd": DictEntry(("t", 3, "q/x")),
    "0/sd/t": TensorEntry("bfloat16", (2, 16), "raw", (PIECE, Piece("data/x", (0, 0), "crc32c:00000000")), True),
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
    referenced = Piece("data/x", (0, 8), "crc32c:0000abcd", "xxh3-128:" + "0f" * 16, "../step_\u00e9")
    assert json.loads(referenced.to_json_line()) == referenced.to_json()
    assert list(referenced.to_json()) == ["location", "byte_range", "checksum", "hash", "base"]


def test_metadata_round_trips_through_text() -> None:
    metadata = SnapshotMetadata(1, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, dict(ENTRIES))
    text = metadata.to_json_text()
    assert SnapshotMetadata.from_text(text) == metadata
    assert SnapshotMetadata.from_text(text.encode()) == metadata
    assert len(text.splitlines()) == 7 + 1 + len(ENTRIES) + 2
    sealed = SnapshotMetadata(3, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, dict(ENTRIES))
    assert sealed.to_json_text().startswith('{"integrity": "sha256:')
    assert SnapshotMetadata.from_text(sealed.to_bytes()) == sealed
    assert len(sealed.to_json_text().splitlines()) == len(text.splitlines())


def test_user_metadata_round_trips_and_is_left_out_when_empty() -> None:
    user_metadata = {"step": 7, "loss": 0.25, "tags": ["a", "\u00e9"], "nested": {"x": None, "ok": True}}
    metadata = SnapshotMetadata(3, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, dict(ENTRIES), user_metadata)
    decoded = SnapshotMetadata.from_text(metadata.to_bytes())
    assert decoded == metadata
    assert list(decoded.user_metadata) == list(user_metadata)
    assert '"user_metadata": {"step": 7,' in metadata.to_json_text()
    empty = SnapshotMetadata(3, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, dict(ENTRIES))
    assert empty.user_metadata == {}
    assert "user_metadata" not in empty.to_json_text()


def test_user_metadata_needs_format_version_3() -> None:
    with pytest.raises(ValueError, match="format version 3"):
        SnapshotMetadata(2, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, {}, {"step": 1}).to_bytes()


@pytest.mark.parametrize("version", [1, 2])
def test_user_metadata_before_version_3_is_an_unknown_member_and_ignored(version: int) -> None:
    document = json.loads(SnapshotMetadata(version, "0.1", "2.13", "2026-11-22T00:00:00+00:00", 1, {}).to_json_text())
    document["user_metadata"] = ["not", "an", "object"]
    assert SnapshotMetadata.from_text(json.dumps(document)).user_metadata == {}


@pytest.mark.parametrize("location", ["../x", "/abs", "a//b", "a/./b", "a/../b", "C:/x", "s3://b/x", "a\\b", "", "a/"])
def test_unsafe_locations(location: str) -> None:
    with pytest.raises(UnsafeLocationError):
        validate_location(location)


def test_safe_location() -> None:
    assert validate_location("data/0_00000_abcd1234") == "data/0_00000_abcd1234"


# --------------------------------------------------------------------------------------------
# malformed manifests


@pytest.mark.parametrize(
    "text",
    [b"{not json: [unclosed", b"\xff\xfe\x00garbage\x00", b"", b"just some words", b"- a\n- b\n"],
    ids=["broken-yaml", "binary", "empty", "scalar", "list"],
)
def test_unparseable_manifest_raises_manifest_error(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    (path / MANIFEST).write_bytes(text)
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert type(exc) is ManifestError
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert MANIFEST in message
    assert "corrupt" in message


def _first_key(document: dict[str, Any], kind: str) -> str:
    return next(k for k, e in document["manifest"].items() if e["kind"] == kind)


def _del_header(name: str) -> Callable[[dict[str, Any]], str]:
    def mutate(document: dict[str, Any]) -> str:
        del document[name]
        return repr(name)

    return mutate


def _set_entry(kind: str, *keys: str, value: Any = None, delete: bool = False) -> Callable[[dict[str, Any]], str]:
    """Set (or delete) ``entry[keys[0]][keys[1]]...`` of the first entry of ``kind``."""

    def mutate(document: dict[str, Any]) -> str:
        key = _first_key(document, kind)
        target: Any = document["manifest"][key]
        for k in keys[:-1]:
            target = target[k]
        if delete:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
        return repr(key)

    return mutate


def _set_header(name: str, value: Any) -> Callable[[dict[str, Any]], str]:
    def mutate(document: dict[str, Any]) -> str:
        document[name] = value
        return name

    return mutate


def _bad_manifest_key(document: dict[str, Any]) -> str:
    key = _first_key(document, "tensor")
    document["manifest"]["model-without-rank"] = document["manifest"].pop(key)
    return "'model-without-rank'"


MALFORMED = {
    "missing-world-size": _del_header("world_size"),
    "missing-manifest": _del_header("manifest"),
    "missing-torch-version": _del_header("torch_version"),
    "missing-dtype": _set_entry("tensor", "dtype", delete=True),
    "missing-pieces": _set_entry("tensor", "pieces", delete=True),
    "missing-kind": _set_entry("tensor", "kind", delete=True),
    "missing-checksum": _set_entry("tensor", "pieces", 0, "checksum", delete=True),
    "unknown-kind": _set_entry("tensor", "kind", value="sharded_tensor_v9"),
    "unknown-serializer": _set_entry("tensor", "serializer", value="safetensors"),
    "unknown-checksum-algorithm": _set_entry("tensor", "pieces", 0, "checksum", value="md5:00ff"),
    "shape-as-string": _set_entry("tensor", "shape", value="2x3"),
    "negative-dim": _set_entry("tensor", "shape", value=[-1, 3]),
    "byte-range-strings": _set_entry("tensor", "pieces", 0, "byte_range", value=["0", "24"]),
    "byte-range-reversed": _set_entry("tensor", "pieces", 0, "byte_range", value=[24, 0]),
    "byte-range-float": _set_entry("tensor", "pieces", 0, "byte_range", value=[0.0, 24.0]),
    "pieces-not-list": _set_entry("tensor", "pieces", value={"location": "data/0_00000"}),
    "int-holding-string": _set_entry("primitive", "value", value="three"),
    "dict-keys-not-list": _set_entry("dict", "keys", value="abc"),
    "world-size-string": _set_header("world_size", "1"),
    "world-size-zero": _set_header("world_size", 0),
    "format-version-string": _set_header("format_version", "1"),
    "format-version-zero": _set_header("format_version", 0),
    "format-name": _set_header("format", "torchsnapshot"),
    "manifest-not-mapping": _set_header("manifest", ["0/model"]),
    "manifest-key-without-rank": _bad_manifest_key,
    "replicated-not-bool": _set_entry("tensor", "replicated", value="yes"),
    "list-length-negative": _set_entry("list", "length", value=-1),
    "primitive-unknown-type": _set_entry("primitive", "type", value="decimal"),
    "dict-key-float": _set_entry("dict", "keys", value=[1.5]),
    "world-size-bool": _set_header("world_size", True),
    "format-version-bool": _set_header("format_version", True),
    "byte-range-bools": _set_entry("tensor", "pieces", 0, "byte_range", value=[False, True]),
    "checksum-not-hex": _set_entry("tensor", "pieces", 0, "checksum", value="crc32c:zzzzzzzz"),
    "user-metadata-list": _set_header("user_metadata", [1, 2]),
    "user-metadata-string": _set_header("user_metadata", "step=3"),
    "user-metadata-null": _set_header("user_metadata", None),
}


@pytest.mark.parametrize("mutate", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_manifest_raises_manifest_error(tmp_path: Path, mutate: Callable[[dict[str, Any]], str]) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    named = mutate(document)
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert not isinstance(exc, (UnsupportedFormatVersionError, UnsafeLocationError))
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert MANIFEST in message
    assert named in message, f"{named} is not named in: {message}"


def test_unknown_entry_kind_is_rejected_by_restore_and_read_object(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["manifest"]["0/extras/future"] = {"kind": "sharded_tensor_v9", "shards": []}
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        Snapshot(str(path)).restore({"model": Net()})  # not even the untouched keys load
    assert "'sharded_tensor_v9'" in str(info.value)
    assert "'0/extras/future'" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).read_object("model/layer1.weight")


def test_truncated_manifest_raises_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    text = (path / MANIFEST).read_bytes()
    (path / MANIFEST).write_bytes(text[: len(text) // 2])
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    assert MANIFEST in str(info.value)


def test_duplicate_manifest_entry_raises_manifest_error(tmp_path: Path) -> None:
    # docs/format.md 8.1: readers should reject duplicate member names rather than keep one silently.
    path = tmp_path / "snap"
    take_basic(path)
    rewrite_as_v4(path)  # per-entry JSON members (version 5: tests/format/test_format_v5.py)
    text = (path / MANIFEST).read_text()
    start = text.index('"0/extras/w":')
    line = text[start : text.index("\n", start)].rstrip(",")
    impostor = line.replace('"shape":[8]', '"shape":[2,4]')
    assert impostor != line
    (path / MANIFEST).write_text(text[:start] + impostor + ",\n" + text[start:])
    reseal_manifest(path)  # a valid integrity line: the duplicate itself must be refused
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    assert "'0/extras/w'" in str(info.value)


def test_container_naming_a_missing_child_raises_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["manifest"]["0/extras"]["keys"].append("ghost")
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:  # at the latest when the container is rebuilt
        Snapshot(str(path)).restore({"extras": StateDict()})
    assert "extras/ghost" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).read_object("extras")


def test_raw_pieces_of_the_wrong_length_raise_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    piece = document["manifest"]["0/extras/w"]["pieces"][0]
    piece["byte_range"][1] -= 1
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        Snapshot(str(path)).read_object("extras/w")
    assert "'extras/w'" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).restore({"extras": StateDict()})


def test_newer_format_version_raises_unsupported_format_version(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["format_version"] = FORMAT_VERSION + 1
    document["snapshotkit_version"] = "9.0.0"
    document["manifest"]["0/extras/future"] = {"kind": "kind_from_the_future"}
    write_manifest_json(path, document)

    with pytest.raises(UnsupportedFormatVersionError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, ManifestError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert f"format version {FORMAT_VERSION + 1}" in message
    assert "'9.0.0'" in message
    assert "upgrade" in message.lower()
    assert "pip install -U snapshotkit" in message


# --------------------------------------------------------------------------------------------
# locations that leave the snapshot


class ReadSpy:
    """Records every data-object location the fs plugin is asked to read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.locations: list[str] = []
        original_read_into = FSStoragePlugin.read_into
        original_read = FSStoragePlugin.read
        spy = self

        async def read_into(self: FSStoragePlugin, location: str, start: int, buffers: Sequence[memoryview]) -> None:
            spy.locations.append(location)
            await original_read_into(self, location, start, buffers)

        async def read(self: FSStoragePlugin, location: str, byte_range: Any = None) -> Any:
            if location != MANIFEST:
                spy.locations.append(location)
            return await original_read(self, location, byte_range)

        monkeypatch.setattr(FSStoragePlugin, "read_into", read_into)
        monkeypatch.setattr(FSStoragePlugin, "read", read)


@pytest.mark.parametrize(
    "location",
    ["../outside", "/etc/passwd", "data/../../x", "data/./0_00000", "data//0_00000", "C:/x", "data\\0_00000", ""],
    ids=["parent", "absolute", "dotdot-inside", "dot", "empty-component", "drive", "backslash", "empty"],
)
def test_location_leaving_the_snapshot_raises_unsafe_location_before_any_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    entry = document["manifest"]["0/extras/w"]
    real = path / entry["pieces"][0]["location"]
    # Put the real bytes where an unsafe reader would look, so following the location would
    # silently "work" (checksums included) instead of failing for another reason.
    for target in (tmp_path / "outside", tmp_path / "x"):
        target.write_bytes(real.read_bytes())
    for piece in entry["pieces"]:
        piece["location"] = location
    write_manifest_json(path, document)
    spy = ReadSpy(monkeypatch)

    with pytest.raises(UnsafeLocationError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, ManifestError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert repr(location) in message
    assert MANIFEST in message
    assert "'extras/w'" in message  # the logical path whose piece it is

    with pytest.raises(UnsafeLocationError):
        Snapshot(str(path)).restore({"model": Net(), "extras": StateDict()})
    with pytest.raises(UnsafeLocationError):
        Snapshot(str(path)).read_object("model/layer1.weight")  # even a path with safe pieces
    assert spy.locations == []


def test_manifest_location_cannot_point_at_the_manifest(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    for piece in document["manifest"]["0/extras/w"]["pieces"]:
        piece["location"] = MANIFEST
    write_manifest_json(path, document)
    with pytest.raises(UnsafeLocationError):
        _ = Snapshot(str(path)).metadata
