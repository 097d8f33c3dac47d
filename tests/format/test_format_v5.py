"""Format version 5: the columnar ``entries`` member (docs/format.md section 11).

Every entry kind round-trips through the columns or the rows; a version-4 rewrite of the same
snapshot reads to the same entries and values; the columns agree with a reader written from the
format text (``tests/_columns.py``); a lookup builds one entry; and hostile columns (wrong lengths,
indices out of range, huge counts, sizes past the limits) are refused with a ``ManifestError``
that names what is wrong.
"""

from __future__ import annotations

import collections
import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _columns import as_json_entries, read_columns, write_columns
from _snapshots import MANIFEST, Net, make_app_state, rewrite_as_v4

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.columnar import MAX_PIECE_BYTES, ColumnarManifest
from snapshotkit._format.entries import decode_entry
from snapshotkit._format.sharded import Box, LocalChunks
from snapshotkit.errors import ManifestError, UnsafeLocationError
from snapshotkit.manifest import (
    FORMAT_VERSION,
    Piece,
    ShardedTensorEntry,
    SnapshotMetadata,
    TensorEntry,
    decode_document,
    encode_document,
)

pytestmark = pytest.mark.usefixtures("clean_env")


def rich_state() -> dict[str, Any]:
    """Every entry kind: containers, primitives, an object, raw tensors (0-d, empty, tied, in several
    pieces), a torch_save tensor (sparse) and a sharded one."""
    model = torch.nn.Linear(4, 2)
    extras = StateDict(
        step=7,
        lr=0.125,
        name="v5 ✓",
        done=True,
        salt=b"\x00\xff",
        note=None,
        history=[1.5, (2, "x")],
        od=collections.OrderedDict([(3, "three"), ("k", 0)]),
        tags={"a", "b"},
        sparse=torch.eye(3).to_sparse(),
        empty=torch.empty(0, 3),
        scalar=torch.tensor(2.5),
        tied=model.weight,
        big=torch.arange(2500, dtype=torch.int16),
        table=LocalChunks(
            torch.float32, (4, 3), ((Box((0, 0), (2, 3)), torch.ones(2, 3)), (Box((2, 0), (2, 3)), torch.zeros(2, 3)))
        ),
    )
    return {"model": model, "extras": extras}


@pytest.fixture
def rich(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> Path:
    clean_env.setenv("SNAPSHOTKIT_CHUNK_BYTES", "1024")  # big: five pieces
    path = tmp_path / "rich"
    Snapshot.take(str(path), rich_state(), replicated=["model/*"])
    return path


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if a.is_sparse:
            return isinstance(b, torch.Tensor) and b.is_sparse and torch.equal(a.to_dense(), b.to_dense())
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_a_take_writes_version_5_and_a_version_4_rewrite_reads_the_same(rich: Path, tmp_path: Path) -> None:
    assert FORMAT_VERSION == 5
    metadata = Snapshot(str(rich)).metadata
    assert metadata.format_version == 5 and isinstance(metadata.manifest, ColumnarManifest)
    old = tmp_path / "as_v4"
    shutil.copytree(rich, old)
    rewrite_as_v4(old)
    v4 = Snapshot(str(old)).metadata
    assert v4.format_version == 4 and type(v4.manifest) is dict
    assert dict(metadata.manifest) == v4.manifest
    assert list(metadata.manifest) == list(v4.manifest)  # the writer's (flatten) order
    kinds = {type(entry).__name__ for entry in v4.manifest.values()}
    assert kinds == {
        "TensorEntry",
        "ShardedTensorEntry",
        "ObjectEntry",
        "PrimitiveEntry",
        "DictEntry",
        "ListEntry",
        "TupleEntry",
    }
    assert {e.serializer for e in v4.manifest.values() if isinstance(e, TensorEntry)} == {"raw", "torch_save"}
    assert len(v4.manifest["0/extras/big"].pieces) == 5  # type: ignore[union-attr]
    for key in v4.manifest:
        logical_path = key.partition("/")[2]
        assert same(Snapshot(str(rich)).read_object(logical_path), Snapshot(str(old)).read_object(logical_path)), key
    assert same(Snapshot(str(rich)).read_object("extras/table"), torch.cat([torch.ones(2, 3), torch.zeros(2, 3)]))


def test_the_columns_say_what_the_format_text_says(rich: Path) -> None:
    document = decode_document((rich / MANIFEST).read_bytes())
    assert "manifest" not in document and list(document)[-1] == "entries"
    expected = {key: decode_entry(key, raw) for key, raw in as_json_entries(document["entries"]).items()}
    manifest = Snapshot(str(rich)).metadata.manifest
    assert dict(manifest) == expected
    assert list(manifest) == list(expected)
    paths = document["entries"]["paths"]
    assert paths == sorted(paths) and list(expected) != ["0/" + path for path in paths]  # sorted, not in order
    assert isinstance(manifest["0/extras/table"], ShardedTensorEntry)  # a row
    assert len(document["entries"]["rows"]) < len(expected) - 5  # the tensors are columns


def test_encoding_is_stable_and_round_trips(rich: Path) -> None:
    data = (rich / MANIFEST).read_bytes()
    metadata = SnapshotMetadata.from_text(data)
    assert metadata.to_bytes() == data
    assert SnapshotMetadata.from_text(metadata.to_bytes()) == metadata
    empty = SnapshotMetadata(5, "x", "y", "2026-11-29T00:00:00+00:00", 1, {}, snapshot_id="0" * 32)
    assert SnapshotMetadata.from_text(empty.to_bytes()) == empty


def test_a_tensor_whose_pieces_lack_a_hash_is_a_row() -> None:
    piece = Piece("data/0_00000", (0, 8), "crc32c:00000000")
    hashed = Piece("data/0_00000", (64, 72), "crc32c:00000001", "xxh3-128:" + "0f" * 16)
    manifest = {
        "0/s": decode_entry("0/s", {"kind": "dict", "keys": ["a", "b"]}),
        "0/s/a": TensorEntry("float32", (2,), "raw", (piece,)),
        "0/s/b": TensorEntry("int64", (), "raw", (hashed,), replicated=True),
    }
    metadata = SnapshotMetadata(5, "x", "y", "2026-11-29T00:00:00+00:00", 1, manifest, snapshot_id="1" * 32)
    data = metadata.to_bytes()
    entries = decode_document(data)["entries"]
    assert [row.get("kind") for row in entries["rows"]] == ["dict", "tensor"]
    assert read_columns(entries)["kind"].tolist() == [0, 0, 1]
    assert read_columns(entries)["order"].tolist() == [0, 1, 2]
    assert dict(SnapshotMetadata.from_text(data).manifest) == manifest


def test_looking_up_a_key_builds_that_entry_alone(rich: Path) -> None:
    manifest = Snapshot(str(rich)).metadata.manifest
    assert isinstance(manifest, ColumnarManifest)
    assert "0/extras/w" not in manifest and "0/extras/big" in manifest and "0/model" in manifest
    for absent in ("1/extras/big", "00/extras/big", "extras/big", "0/", "0/extras/bi", 3, "99999999999/x"):
        assert absent not in manifest and manifest.get(absent) is None  # type: ignore[call-overload]
    with pytest.raises(KeyError):
        _ = manifest["0/nothing"]
    entry = manifest["0/extras/big"]
    assert isinstance(entry, TensorEntry) and entry.shape == (2500,) and len(entry.pieces) == 5
    assert manifest._built is None  # nothing else was built
    assert len(manifest) == len(list(manifest)) and manifest._built is not None
    assert manifest["0/extras/big"] == entry


def test_an_incremental_snapshot_keeps_its_references_in_the_columns(tmp_path: Path, clean_env: Any) -> None:
    clean_env.setenv("SNAPSHOTKIT_MIN_REFERENCE_BYTES", "1")
    base, step = tmp_path / "base", tmp_path / "step"
    Snapshot.take(str(base), make_app_state())
    state = make_app_state()
    state["extras"]["w"] += 1
    Snapshot.take(str(step), state, base=str(base))
    entries = decode_document((step / MANIFEST).read_bytes())["entries"]
    assert entries["bases"] == ["../base"]
    columns = read_columns(entries)
    assert sorted(set(columns["base"].tolist())) == [0, 1]
    manifest = Snapshot(str(step)).metadata.manifest
    assert manifest["0/model/layer1.weight"].pieces[0].base == "../base"  # type: ignore[union-attr]
    assert manifest["0/extras/w"].pieces[0].base is None  # type: ignore[union-attr]
    assert torch.equal(Snapshot(str(step)).read_object("extras/w"), torch.arange(8.0) + 1)
    app = {"model": Net(), "extras": StateDict(step=0, w=torch.zeros(8), name="", history=[])}
    with torch.no_grad():
        app["model"].layer1.weight.zero_()
    Snapshot(str(step)).restore(app)
    assert torch.equal(app["model"].layer1.weight, state["model"].layer1.weight)
    assert torch.equal(app["extras"]["w"], torch.arange(8.0) + 1)


def test_containers_are_checked_on_first_iteration_not_on_a_lookup(tmp_path: Path) -> None:
    """A dict row that no longer names a child: reading one leaf works, anything that iterates refuses."""
    path = tmp_path / "snap"
    Snapshot.take(str(path), make_app_state())
    document = decode_document((path / MANIFEST).read_bytes())
    rows = document["entries"]["rows"]
    extras = next(row for row in rows if row.get("keys") == ["step", "w", "name", "history"])
    extras["keys"].remove("w")
    (path / MANIFEST).write_bytes(encode_document(document))
    assert torch.equal(Snapshot(str(path)).read_object("extras/w"), torch.arange(8.0))
    with pytest.raises(ManifestError, match=r"'0/extras/w'.*no container names this entry"):
        Snapshot(str(path)).restore(make_app_state())


# --------------------------------------------------------------------------------------------
# hostile entries members


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("v5") / "snap"
    Snapshot.take(str(path), make_app_state())
    data = (path / MANIFEST).read_bytes()
    shutil.rmtree(path)
    document = decode_document(data)
    assert document["entries"]["paths"][6] == "extras/w"  # the cases below edit it (8 float32, one piece)
    return document


W = 6  # entry index of extras/w
Mutation = Callable[[dict[str, Any], dict[str, np.ndarray]], dict[str, Any]]


def _set(name: str, index: int, value: int) -> Mutation:
    def mutate(entries: dict[str, Any], columns: dict[str, np.ndarray]) -> dict[str, Any]:
        column = columns[name].astype(object)
        column[index] = value
        return write_columns(entries, **{name: column})

    return mutate


def _member(name: str, value: Any) -> Mutation:
    return lambda entries, _: {**entries, name: value}


def _w_piece(columns: dict[str, np.ndarray]) -> int:
    return int(columns["piece_count"][:W].sum())


HOSTILE: dict[str, tuple[Mutation, type[ManifestError], str]] = {
    "column-short": (
        lambda e, c: write_columns(e, rank=c["rank"][:-1]),
        ManifestError,
        "'rank' holds 36 bytes where 40 are needed",
    ),
    "column-not-base64": (_member("kind", "!!!!"), ManifestError, "'kind' is not base64"),
    "column-not-a-string": (_member("start", [0, 64]), ManifestError, "'start' must be a base64 string"),
    "paths-not-strings": (_member("paths", [1, 2]), ManifestError, "'paths' must be an array of strings"),
    "rows-not-a-list": (_member("rows", {}), ManifestError, "'rows' must be an array"),
    "rank-past-world-size": (_set("rank", 9, 1), ManifestError, "rank 1 .* is not < world_size 1"),
    "paths-unsorted": (
        lambda e, c: {**e, "paths": [e["paths"][1], e["paths"][0], *e["paths"][2:]]},
        ManifestError,
        "'0/extras'.*not sorted and unique",
    ),
    "paths-repeated": (
        lambda e, c: {**e, "paths": [*e["paths"][:7], e["paths"][6], *e["paths"][8:]]},
        ManifestError,
        "not sorted and unique",
    ),
    "order-out-of-range": (_set("order", 0, 10), ManifestError, "'order' holds 10, not below the 10 entries"),
    "order-repeated": (_set("order", 0, 1), ManifestError, "'order' is not a permutation"),
    "kind-code": (_set("kind", W, 7), ManifestError, "'0/extras/w'.*kind code is not 0, 1 or 2"),
    "replicated-flag": (_set("replicated", W, 2), ManifestError, "'0/extras/w'.*replicated flag"),
    "dtype-index": (_set("dtype", W, 9), ManifestError, "'0/extras/w'.*dtype index is not below 1"),
    "row-with-columns": (_set("dtype", 0, 1), ManifestError, "'0/extras'.*a row has columns"),
    "rows-missing": (lambda e, c: {**e, "rows": e["rows"][:-1]}, ManifestError, "'rows' has 6 entries where .* 7"),
    "row-malformed": (
        lambda e, c: {**e, "rows": [{"kind": "nope"}, *e["rows"][1:]]},
        ManifestError,
        "'0/extras'.*unknown entry kind 'nope'",
    ),
    "location-index": (
        lambda e, c: _set("location", _w_piece(c), 5)(e, c),
        ManifestError,
        "'0/extras/w'.*location index is not below 1",
    ),
    "base-index": (lambda e, c: _set("base", 0, 1)(e, c), ManifestError, "base index is not at most 0"),
    "negative-start": (_set("start", 0, -64), ManifestError, r"start is not in \[0, "),
    "length-past-the-limit": (_set("length", 0, MAX_PIECE_BYTES), ManifestError, r"length is not in \[0, "),
    "lengths-adding-up-past-the-limit": (
        lambda e, c: write_columns(e, length=[MAX_PIECE_BYTES - 1] * len(c["length"])),
        ManifestError,
        f"the pieces of the manifest hold {MAX_PIECE_BYTES} bytes or more",
    ),
    "bytes-not-the-shape": (
        lambda e, c: _set("length", _w_piece(c), 36)(e, c),
        ManifestError,
        "'0/extras/w'.*pieces hold 36 bytes but 8 element.* need 32",
    ),
    "huge-piece-count": (
        _set("piece_count", W, 2**32 - 1),
        ManifestError,
        "'location' holds 12 bytes where 17179869188 are needed",
    ),
    "huge-ndim": (_set("ndim", W, 2**32 - 1), ManifestError, "'dims' holds 32 bytes where 34359738384 are needed"),
    "hash-short": (
        lambda e, c: write_columns(e, hash=c["hash"][:-1]),
        ManifestError,
        "'hash' holds 32 bytes where 48 are needed",
    ),
    "negative-dim": (
        lambda e, c: _set("dims", int(c["ndim"][:W].sum()), -8)(e, c),
        ManifestError,
        "'0/extras/w'.*negative",
    ),
    "too-many-elements": (
        lambda e, c: write_columns(e, dims=[*c["dims"][:-2].tolist(), 2**62, 2**62]),
        ManifestError,
        "'0/model/layer1.weight'.*more elements than torch can index",
    ),
    "bad-dtype-name": (_member("dtypes", ["Float 32"]), ManifestError, "'Float 32', which is not a torch dtype"),
    "raw-quantized": (_member("dtypes", ["qint8"]), ManifestError, "dtype 'qint8' cannot be stored raw"),
    "location-outside": (_member("locations", ["../../etc/passwd"]), UnsafeLocationError, "'locations'.*leave"),
    "base-not-in-header": (_member("bases", ["../elsewhere"]), ManifestError, "'../elsewhere'.* does not list"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_columns_are_refused_naming_what_is_wrong(document: dict[str, Any], case: str) -> None:
    mutate, error, message = HOSTILE[case]
    hostile = copy.deepcopy(document)
    hostile["entries"] = mutate(hostile["entries"], read_columns(hostile["entries"]))
    with pytest.raises(error, match=message):
        SnapshotMetadata.from_text(encode_document(hostile))


def test_ranks_must_be_sorted(document: dict[str, Any]) -> None:
    hostile = copy.deepcopy(document)
    hostile["world_size"] = 2
    hostile["entries"] = write_columns(hostile["entries"], rank=[0, 0, 0, 0, 0, 0, 0, 0, 1, 0])
    with pytest.raises(ManifestError, match="'rank' is not sorted at entry 9"):
        SnapshotMetadata.from_text(encode_document(hostile))


@pytest.mark.parametrize("value", [None, [], "entries", 5])
def test_entries_must_be_an_object(document: dict[str, Any], value: Any) -> None:
    hostile = {**document, "entries": value}
    if value is None:
        del hostile["entries"]
    with pytest.raises(ManifestError, match="'entries' must be a JSON object"):
        SnapshotMetadata.from_text(encode_document(hostile))


def test_a_version_4_manifest_has_no_entries_member_and_v5_needs_one(document: dict[str, Any]) -> None:
    """A version-5 document with a version-4 ``manifest`` instead is refused, not read as empty."""
    hostile = {k: v for k, v in document.items() if k != "entries"}
    hostile["manifest"] = {}
    with pytest.raises(ManifestError, match="'entries' must be a JSON object"):
        SnapshotMetadata.from_text(encode_document(hostile))


def test_ranks_sort_as_numbers_and_each_key_is_found() -> None:
    """Keys of ranks 0 to 11 (``"10/..."`` sorts after ``"9/..."``), each found by its rank's bisection."""
    hashed = Piece("data/0_00000", (0, 8), "crc32c:00000000", "xxh3-128:" + "00" * 16)
    manifest: dict[str, Any] = {}
    for rank in (11, 10, 2, 1, 0, 9):
        manifest[f"{rank}/s"] = decode_entry("k", {"kind": "dict", "keys": ["b", "a"]})
        manifest[f"{rank}/s/b"] = TensorEntry("float32", (2,), "raw", (hashed,))
        manifest[f"{rank}/s/a"] = TensorEntry("int64", (), "raw", (hashed,))
    metadata = SnapshotMetadata(5, "x", "y", "2026-11-29T00:00:00+00:00", 12, manifest, snapshot_id="2" * 32)
    decoded = SnapshotMetadata.from_text(metadata.to_bytes())
    entries = decode_document(metadata.to_bytes())["entries"]
    assert read_columns(entries)["rank"].tolist() == [r for r in (0, 1, 2, 9, 10, 11) for _ in range(3)]
    for key, entry in manifest.items():
        assert decoded.manifest[key] == entry
    for absent in ("3/s", "12/s", "1/s/c", "10/s/"):
        assert absent not in decoded.manifest
    assert list(decoded.manifest) == list(manifest)
