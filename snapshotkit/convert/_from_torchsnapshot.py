"""A torchsnapshot snapshot directory as app state, read directly (torchsnapshot is not imported).

Its ``.snapshot_metadata`` (JSON, or YAML from older writers) is ``{"version", "world_size",
"manifest"}``; the manifest maps ``"<rank>/<logical path>"`` to an entry: containers (``list``,
``dict``, ``OrderedDict`` with their ``keys``), inline primitives (``int``, ``str``, ``bool``;
``bytes`` and ``float`` as base64, a float as a packed C double), ``Tensor`` (``location``,
``serializer`` ``buffer_protocol`` = raw little-endian elements or ``torch_save``, ``dtype`` as
``"torch.float32"``, ``shape``, ``byte_range`` ``[begin, end)`` or null for the whole file),
``ChunkedTensor`` (a large tensor split along dim 0), ``ShardedTensor`` and ``DTensor`` (each
rank's shards, at global offsets) and ``object`` (a ``torch.save`` pickle). Path components escape
``%`` and ``/`` as ``%25`` and ``%2F``.

What is imported is rank 0's view, as torchsnapshot restores it on rank 0: rank 0's entries,
replicated entries (which torchsnapshot stores once, under rank 0), and sharded tensors assembled
whole from every rank's shards. Other ranks' own state is reported in ``skipped_paths``. Chunked
tensors whose chunks lie back to back in one file are mapped; other chunked and sharded tensors
are assembled in memory.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.foreign import is_torchsnapshot_document
from snapshotkit._text import first_few
from snapshotkit.convert._files import MappedFiles
from snapshotkit.convert._source import Loaded, load_object
from snapshotkit.errors import ImportSourceError

_CONTAINERS = ("list", "dict", "OrderedDict")
_SHARDED = ("ShardedTensor", "DTensor")


def read_torchsnapshot(src: Path, *, key: str, weights_only: bool) -> Loaded:
    """The state of the torchsnapshot snapshot in directory ``src`` (``key`` is not used: its
    app-state keys are torchsnapshot's).

    Raises:
        UnsafeObjectError: ``weights_only`` refused an object.
        ImportSourceError: the manifest is not torchsnapshot's or is malformed, a data file is
            missing or truncated.
    """
    del key
    manifest, world_size = _read_manifest(src)
    view, skipped = _rank0_view(manifest, world_size, src)
    reader = _Reader(src, view, weights_only)
    app_keys = list(dict.fromkeys(path.split("/", 1)[0] for path in view))
    try:
        states = {_unescape(app_key): reader.build(app_key) for app_key in app_keys}
    except RecursionError:
        raise ImportSourceError(f"{src}/{METADATA_FILENAME}: containers nest too deep to import") from None
    return Loaded(states, skipped_paths=tuple(skipped))


def _read_manifest(src: Path) -> tuple[dict[str, Any], int]:
    path = src / METADATA_FILENAME
    data = path.read_bytes()
    try:
        document = json.loads(data)
    except ValueError:
        import yaml

        try:
            document = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise ImportSourceError(f"{path} is neither JSON nor YAML ({exc}); it is corrupt") from exc
    if not is_torchsnapshot_document(document):
        raise ImportSourceError(f"{path} is not a torchsnapshot manifest (no version, world_size and manifest)")
    world_size = document["world_size"]
    if type(world_size) is not int or world_size < 1:
        raise ImportSourceError(f"{path}: world_size {world_size!r} is not a positive int")
    return dict(document["manifest"]), world_size


def _rank0_view(manifest: dict[str, Any], world_size: int, src: Path) -> tuple[dict[str, Any], list[str]]:
    """Rank 0's entries by logical path (sharded ones merged over every rank), and what other ranks
    alone hold (``"<rank>/<logical path>"``)."""
    view: dict[str, Any] = {}
    shards: dict[str, list[Any]] = {}
    skipped: list[str] = []
    for full_path, entry in manifest.items():
        rank_text, _, logical = str(full_path).partition("/")
        if not (rank_text.isdigit() and int(rank_text) < world_size and logical and isinstance(entry, dict)):
            raise ImportSourceError(
                f"{src}/{METADATA_FILENAME}: {full_path!r} is not '<rank>/<logical path>' with an entry (world size "
                f"{world_size}); the manifest is corrupt"
            )
        kind = entry.get("type")
        if kind in _SHARDED:
            shards.setdefault(logical, []).extend(_list(entry, "shards", full_path, src))
        if int(rank_text) == 0:
            view[logical] = entry
        elif kind not in _CONTAINERS and kind not in _SHARDED and not entry.get("replicated"):
            skipped.append(full_path)
    for logical, found in shards.items():
        if logical in view:
            view[logical] = {**view[logical], "shards": found}
    return view, skipped


class _Reader:
    """Builds each app-state key's state from the rank-0 view, loading leaves as it goes."""

    def __init__(self, src: Path, view: dict[str, Any], weights_only: bool) -> None:
        self._src = src
        self._view = view
        self._weights_only = weights_only
        self._files = MappedFiles(src, src)
        self._children: dict[str, list[str]] = {}
        for path in view:
            parent, slash, child = path.rpartition("/")
            if slash:
                self._children.setdefault(parent, []).append(child)

    def build(self, path: str) -> Any:
        entry = self._view.get(path)
        if entry is None:
            raise ImportSourceError(
                f"{self._src}/{METADATA_FILENAME}: the container entries name {path!r}, which "
                "has no entry; the manifest is incomplete"
            )
        kind = entry.get("type")
        if kind == "list":
            names = self._children.get(path, [])
            if sorted(names, key=lambda n: int(n) if n.isdigit() else -1) != [str(i) for i in range(len(names))]:
                raise ImportSourceError(
                    f"{self._src}: list {path!r} has the items {first_few(sorted(names))}, not 0 to n-1"
                )
            return [self.build(f"{path}/{i}") for i in range(len(names))]
        if kind in ("dict", "OrderedDict"):
            keys = _list(entry, "keys", path, self._src)
            items = [(k, self.build(f"{path}/{_escape(str(k))}")) for k in keys]
            return OrderedDict(items) if kind == "OrderedDict" else dict(items)
        return self._leaf(path, entry, kind)

    def _leaf(self, path: str, entry: dict[str, Any], kind: object) -> Any:
        if kind in ("int", "str", "bool", "bytes", "float"):
            return _primitive(path, entry, kind, self._src)
        if kind == "Tensor":
            return self._tensor(path, entry)
        if kind == "ChunkedTensor":
            return self._assemble(path, entry, _list(entry, "chunks", path, self._src), chunked=True)
        if kind in _SHARDED:
            return self._assemble(path, entry, _list(entry, "shards", path, self._src), chunked=False)
        if kind == "object":
            what = f"the object at {path!r} ({entry.get('obj_type')})"
            return load_object(self._bytes(path, entry), weights_only=self._weights_only, what=what, src=self._src)
        raise ImportSourceError(
            f"{self._src}: {path!r} is a {kind!r} entry, which import does not know; nothing was imported"
        )

    def _tensor(self, path: str, entry: dict[str, Any]) -> torch.Tensor:
        dtype, shape = _dtype(path, entry, self._src), _shape(path, entry.get("shape"), self._src)
        serializer = entry.get("serializer")
        if serializer == "torch_save":
            what = f"tensor {path!r}"
            value = load_object(self._bytes(path, entry), weights_only=self._weights_only, what=what, src=self._src)
            if isinstance(value, torch.Tensor) and value.dtype == dtype and tuple(value.shape) == shape:
                return value
            raise ImportSourceError(f"{self._src}: {what} does not hold the {dtype} {list(shape)} tensor it says")
        if serializer != "buffer_protocol":
            raise ImportSourceError(f"{self._src}: tensor {path!r} has serializer {serializer!r}, which is unknown")
        where, start, end = self._range(path, entry)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if end - start != nbytes:
            raise ImportSourceError(
                f"{self._src}: tensor {path!r} ({dtype} {list(shape)}) needs {nbytes} bytes, its range holds "
                f"{end - start}; the snapshot is corrupt"
            )
        return self._files.tensor(where, start, dtype, shape, f"tensor {path!r}")

    def _assemble(self, path: str, entry: dict[str, Any], parts: list[Any], *, chunked: bool) -> torch.Tensor:
        boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[str, Any]] = {}
        for part in parts:
            if not isinstance(part, dict) or not isinstance(part.get("tensor"), dict):
                raise ImportSourceError(f"{self._src}: a shard or chunk of {path!r} is malformed")
            offsets = _shape(path, part.get("offsets"), self._src)
            sizes = _shape(path, part.get("sizes"), self._src)
            boxes.setdefault((offsets, sizes), part["tensor"])  # a DTensor's replicas repeat their shards
        if chunked:
            dtype, shape = _dtype(path, entry, self._src), _shape(path, entry.get("shape"), self._src)
            mapped = self._contiguous_chunks(path, boxes, dtype, shape)
            if mapped is not None:
                return mapped
        elif boxes:
            dtype = _dtype(path, next(iter(boxes.values())), self._src)
            ndim = len(next(iter(boxes))[0])
            shape = tuple(max(o[d] + s[d] for o, s in boxes) for d in range(ndim))
        else:
            raise ImportSourceError(f"{self._src}: sharded tensor {path!r} has no shards")
        full = torch.empty(shape, dtype=dtype)
        covered = 0
        for (offsets, sizes), tensor_entry in sorted(boxes.items()):
            if len(offsets) != full.dim() or len(sizes) != full.dim():
                raise ImportSourceError(f"{self._src}: a piece of {path!r} does not have {full.dim()} dimensions")
            box = full
            for dim, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
                if offset + size > full.shape[dim]:
                    raise ImportSourceError(f"{self._src}: a piece of {path!r} lies outside its {list(shape)}")
                box = box.narrow(dim, offset, size)
            piece = self._tensor(f"{path} piece at {list(offsets)}", tensor_entry)
            if tuple(piece.shape) != sizes or piece.dtype != dtype:
                raise ImportSourceError(f"{self._src}: a piece of {path!r} is not the {dtype} {list(sizes)} it says")
            box.copy_(piece)
            covered += math.prod(sizes)
        if covered != full.numel():
            raise ImportSourceError(
                f"{self._src}: the pieces of {path!r} hold {covered} of its {full.numel()} elements; the snapshot "
                "is incomplete"
            )
        return full

    def _contiguous_chunks(
        self,
        path: str,
        boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[str, Any]],
        dtype: torch.dtype,
        shape: tuple[int, ...],
    ) -> torch.Tensor | None:
        """The chunked tensor mapped whole, if its raw chunks lie back to back in one file in order."""
        ordered = sorted(boxes.items())
        entries = [tensor_entry for _, tensor_entry in ordered]
        if not entries or any(e.get("serializer") != "buffer_protocol" or not e.get("byte_range") for e in entries):
            return None
        if len({e.get("location") for e in entries}) != 1:
            return None
        ranges = [self._range(path, e) for e in entries]
        rows = 0
        for (offsets, sizes), _ in ordered:
            if not offsets or offsets[0] != rows or offsets[1:] != (0,) * (len(offsets) - 1) or sizes[1:] != shape[1:]:
                return None
            rows += sizes[0]
        if any(a[2] != b[1] for a, b in itertools.pairwise(ranges)) or not shape or rows != shape[0]:
            return None
        where, start, end = ranges[0][0], ranges[0][1], ranges[-1][2]
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if end - start != nbytes:
            return None
        return self._files.tensor(where, start, dtype, shape, f"tensor {path!r}")

    def _range(self, path: str, entry: dict[str, Any]) -> tuple[Path, int, int]:
        location = entry.get("location")
        if not isinstance(location, str):
            raise ImportSourceError(f"{self._src}: {path!r} has no location")
        where = self._files.resolve(location, repr(path))
        byte_range = entry.get("byte_range")
        if byte_range is None:
            return where, 0, self._files.size_bytes(where)
        if not (isinstance(byte_range, list) and len(byte_range) == 2 and all(type(b) is int for b in byte_range)):
            raise ImportSourceError(f"{self._src}: {path!r} has byte_range {byte_range!r}, not [begin, end]")
        self._files.check_range(where, byte_range[0], byte_range[1], repr(path))
        return where, byte_range[0], byte_range[1]

    def _bytes(self, path: str, entry: dict[str, Any]) -> bytes:
        where, start, end = self._range(path, entry)
        return self._files.read_bytes(where, start, end, repr(path))


def _primitive(path: str, entry: dict[str, Any], kind: object, src: Path) -> Any:
    text = entry.get("serialized_value")
    if not isinstance(text, str):
        raise ImportSourceError(f"{src}: primitive {path!r} has no serialized_value string")
    try:
        if kind == "int":
            return int(text)
        if kind == "str":
            return text
        if kind == "bool":
            if text not in ("True", "False"):
                raise ValueError(f"not True or False: {text[:20]!r}")
            return text == "True"
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        return raw if kind == "bytes" else struct.unpack("<d", raw)[0]
    except (ValueError, binascii.Error, struct.error, UnicodeEncodeError) as exc:
        raise ImportSourceError(f"{src}: the {kind} at {path!r} is malformed ({exc})") from exc


def _dtype(path: str, entry: dict[str, Any], src: Path) -> torch.dtype:
    name = entry.get("dtype")
    dtype = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ImportSourceError(f"{src}: tensor {path!r} has dtype {name!r}, which torch {torch.__version__} lacks")
    return dtype


def _shape(path: str, raw: object, src: Path) -> tuple[int, ...]:
    if not (isinstance(raw, list) and all(type(d) is int and d >= 0 for d in raw)):
        raise ImportSourceError(f"{src}: {path!r} has {raw!r} where a list of sizes or offsets belongs")
    return tuple(raw)


def _list(entry: dict[str, Any], name: str, path: object, src: Path) -> list[Any]:
    value = entry.get(name)
    if not isinstance(value, list):
        raise ImportSourceError(f"{src}: {path!r} has no {name} list")
    return value


def _escape(key: str) -> str:
    return key.replace("%", "%25").replace("/", "%2F")


def _unescape(component: str) -> str:
    return component.replace("%2F", "/").replace("%25", "%")
