"""The manifest fuzzer, run as a child process with a capped address space (see test_fuzz_manifest.py).

Usage: ``python _fuzz_child.py <workdir> <examples> <seed> [<format version>]``. Takes a small
snapshot in ``workdir`` and an incremental one with ``base=`` it (snapshot ids, content hashes, a
``bases`` header and references), in format version 5 (columnar entries) or, rewritten, 4 (one JSON
entry per key), then lets hypothesis damage the incremental one's manifest in three ways:

- ``bytes``: changed, inserted or deleted bytes, the integrity line left as it was;
- ``structure``: a member anywhere in the document replaced (hostile values: huge, negative
  and odd integers, dtype names, hash, id and base-location look-alikes, strings, containers,
  nothing), then resealed so the
  integrity check passes and the semantic checks are what is tested;
- ``sizes``: a tensor entry's shape and byte ranges set to crafted sizes (half of the time
  consistent with each other, so only the data objects' real sizes can refute them), resealed
  (version 5: in the columns; sizes a column cannot hold are skipped, as JSON cannot hold some).

After each mutation it opens the snapshot, restores it and reads every logical path. Every
outcome must be a correct result or a :class:`SnapshotkitError`; damaged bytes must be refused.
Another exception fails the run; a crash, a hang (the parent's timeout) or memory beyond the
cap (allocations fail) does too. Prints one JSON line of outcome counts.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _snapshots

import hypothesis
import numpy as np
import torch
from _columns import as_json_entries, read_columns, write_columns
from _snapshots import MANIFEST, Net, make_app_state, rewrite_as_v4
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit.errors import ManifestError, SnapshotkitError
from snapshotkit.manifest import decode_document, encode_document

CAP_BYTES = 1 << 30

INTEGERS = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63), 10**4000]),
)
DTYPE_NAMES = st.sampled_from(
    ["float32", "int64", "quint4x2", "quint2x4", "qint8", "bits8", "uint3", "float128", "", "../x", "bool"]
)
#: Texts close to the version-4 members: content hashes, snapshot ids and base locations.
VERSION_4_TEXTS = st.sampled_from(
    [
        "xxh3-128:" + "0" * 32,
        "xxh3-128:" + "F" * 32,
        "xxh3-64:" + "0" * 16,
        "0123456789abcdef0123456789abcdef",
        "0123456789abcdef",
        "../base",
        "../snap",
        "../../base",
        "../",
        "/base",
        "base",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INTEGERS,
    st.floats(allow_nan=False, allow_infinity=False),
    DTYPE_NAMES,
    VERSION_4_TEXTS,
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _members(node: Any, trail: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path of keys/indices into the document."""
    found = [trail] if trail else []
    if isinstance(node, dict):
        for key, child in node.items():
            found.extend(_members(child, (*trail, key)))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(_members(child, (*trail, index)))
    return found


def _replace(document: dict[str, Any], trail: tuple[Any, ...], value: Any, delete: bool) -> dict[str, Any]:
    out = copy.deepcopy(document)
    parent: Any = out
    for step in trail[:-1]:
        parent = parent[step]
    if delete and isinstance(parent, dict):
        del parent[trail[-1]]
    elif delete:
        parent.pop(trail[-1])
    else:
        parent[trail[-1]] = value
    return out


class Fuzzer:
    def __init__(self, workdir: Path, version: int) -> None:
        self.snapshot = workdir / "snap"
        base = workdir / "base"
        os.environ["SNAPSHOTKIT_MIN_REFERENCE_BYTES"] = "1"  # the tiny tensors are referenced too
        Snapshot.take(str(base), make_app_state())
        app_state = make_app_state()
        app_state["extras"]["w"] += 1  # written again; the model is referenced
        Snapshot.take(str(self.snapshot), app_state, base=str(base))
        del os.environ["SNAPSHOTKIT_MIN_REFERENCE_BYTES"]
        if version == 4:
            rewrite_as_v4(self.snapshot)
        self.original = (self.snapshot / MANIFEST).read_bytes()
        self.document = decode_document(self.original)
        assert self.document["format_version"] == version
        assert self.document["bases"] == {"../base": decode_document((base / MANIFEST).read_bytes())["snapshot_id"]}
        entries = self.document["manifest"] if version == 4 else as_json_entries(self.document["entries"])
        referenced = [p for e in entries.values() for p in e.get("pieces", []) if "base" in p]
        assert referenced, "the incremental take referenced nothing"
        self.logical_paths = sorted({key.partition("/")[2] for key in entries})
        self.expected = self._read_everything()
        self.outcomes: collections.Counter[str] = collections.Counter()

    def _read_everything(self) -> dict[str, Any]:
        snapshot = Snapshot(str(self.snapshot))
        _ = snapshot.metadata
        app = {"model": Net(), "extras": StateDict()}
        snapshot.restore(app)
        values: dict[str, Any] = {"restored": {k: v.state_dict() for k, v in app.items()}}
        for logical_path in self.logical_paths:
            values[logical_path] = snapshot.read_object(logical_path)
        return values

    def attempt(self, data: bytes, kind: str, must_fail: bool) -> None:
        (self.snapshot / MANIFEST).write_bytes(data)
        try:
            got = self._read_everything()
        except SnapshotkitError as exc:
            if must_fail and not isinstance(exc, ManifestError):
                raise AssertionError(f"{kind}: damaged bytes raised {type(exc).__name__}, not ManifestError") from exc
            self.outcomes[f"{kind}:{type(exc).__name__}"] += 1
            return
        if must_fail:
            raise AssertionError(f"{kind}: damaged manifest bytes were accepted")
        self.outcomes[f"{kind}:ok" if _same(got, self.expected) else f"{kind}:ok-different-values"] += 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _sized_v5(document: dict[str, Any], index: int, shape: list[int], start: int, end: int, consistent: bool) -> None:
    """:func:`run`'s ``sizes`` in the columns of a version-5 document: entry ``index`` gets ``shape``
    and its pieces the byte range ``[start, end)`` (or, ``consistent``, one piece of the shape's bytes).

    Raises:
        OverflowError: a column's type cannot hold a value.
    """
    entries = document["entries"]
    c = read_columns(entries)
    dim_at = [0, *np.cumsum(c["ndim"], dtype=np.int64).tolist()]
    piece_at = [0, *np.cumsum(c["piece_count"], dtype=np.int64).tolist()]
    dims = [*c["dims"][: dim_at[index]].tolist(), *shape, *c["dims"][dim_at[index + 1] :].tolist()]
    ndim = c["ndim"].astype(object)
    ndim[index] = len(shape)
    first, last = piece_at[index], piece_at[index + 1]
    pieces = {name: c[name][first:last].astype(object) for name in ("location", "start", "length", "checksum", "base")}
    digests = c["hash"][first:last]
    count = c["piece_count"].astype(object)
    if consistent and last > first:
        numel = 1
        for dim in shape:
            numel *= max(dim, 0)
        itemsize = RAW_ITEMSIZE.get(entries["dtypes"][int(c["dtype"][index])], 1)
        pieces = {name: values[:1] for name, values in pieces.items()}
        pieces["start"][0], pieces["length"][0] = max(start, 0), numel * itemsize
        digests, count[index] = digests[:1], 1
    else:
        pieces["start"][:], pieces["length"][:] = start, end - start
    columns: dict[str, Any] = {"dims": np.array(dims, dtype=object), "ndim": ndim, "piece_count": count}
    for name, values in pieces.items():
        columns[name] = np.concatenate([c[name][:first].astype(object), values, c[name][last:].astype(object)])
    columns["hash"] = np.concatenate([c["hash"][:first], digests, c["hash"][last:]])
    for name, values in columns.items():  # a value the column's type cannot hold: not this test's concern
        if name != "hash" and any(not -(2**63) <= int(v) < 2**64 for v in values):
            raise OverflowError(name)
    document["entries"] = write_columns(entries, **columns)


def run(workdir: Path, examples: int, seed: int, version: int) -> dict[str, int]:
    fuzzer = Fuzzer(workdir, version)
    members = _members(fuzzer.document)
    if version == 4:
        tensors = [k for k, e in fuzzer.document["manifest"].items() if e.get("kind") in ("tensor", "sharded_tensor")]
    else:
        kinds = read_columns(fuzzer.document["entries"])["kind"].tolist()
        tensors = [str(i) for i, kind in enumerate(kinds) if kind != 0]
    common = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )

    @common
    @given(data=st.data())
    def damaged_bytes(data: st.DataObject) -> None:
        original = fuzzer.original
        start = data.draw(st.integers(0, len(original) - 1), label="start")
        length = data.draw(st.integers(0, 4), label="deleted")
        inserted = data.draw(st.binary(max_size=4), label="inserted")
        mutated = original[:start] + inserted + original[start + length :]
        if mutated != original:
            fuzzer.attempt(mutated, "bytes", must_fail=True)

    @common
    @given(trail=st.sampled_from(members), value=VALUES, delete=st.booleans())
    def structure(trail: tuple[Any, ...], value: Any, delete: bool) -> None:
        document = _replace(fuzzer.document, trail, value, delete)
        try:
            data = encode_document(document)
        except ValueError:  # not encodable (e.g. an integer JSON cannot write): nothing to test
            return
        fuzzer.attempt(data, "structure", must_fail=False)

    @common
    @given(
        key=st.sampled_from(tensors),
        shape=st.lists(INTEGERS, max_size=3),
        start=INTEGERS,
        end=INTEGERS,
        consistent=st.booleans(),
    )
    def sizes(key: str, shape: list[int], start: int, end: int, consistent: bool) -> None:
        document = copy.deepcopy(fuzzer.document)
        if version == 5:
            try:
                _sized_v5(document, int(key), shape, start, end, consistent)
                data = encode_document(document)
            except (OverflowError, ValueError):
                return
            fuzzer.attempt(data, "sizes", must_fail=False)
            return
        entry = document["manifest"][key]
        entry["shape"] = shape
        pieces = entry.get("pieces", [])
        if consistent and pieces:  # bytes that agree with the shape: only the data objects can refute them
            numel = 1
            for dim in shape:
                numel *= max(dim, 0)
            itemsize = RAW_ITEMSIZE.get(entry.get("dtype", ""), 1)
            first = max(start, 0)
            entry["pieces"] = [{**pieces[0], "byte_range": [first, first + numel * itemsize]}]
        else:
            for piece in pieces:
                piece["byte_range"] = [start, end]
        try:
            data = encode_document(document)
        except ValueError:
            return
        fuzzer.attempt(data, "sizes", must_fail=False)

    for test in (damaged_bytes, structure, sizes):
        hypothesis.seed(seed)(test)()
    (fuzzer.snapshot / MANIFEST).write_bytes(fuzzer.original)
    return dict(fuzzer.outcomes)


def main() -> int:
    workdir, examples, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    version = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    limit = _address_space_bytes() + CAP_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        outcomes = run(workdir, examples, seed, version)
    except BaseException:
        traceback.print_exc()
        return 1
    print(json.dumps({"pid": os.getpid(), "outcomes": outcomes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
