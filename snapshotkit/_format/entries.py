"""Manifest entries: what one logical path of a snapshot holds, and how it is encoded.

The manifest maps ``"<rank>/<logical path>"`` to one entry per node of the flattened app
state: containers (dict, ordered dict, list, tuple), inline primitives, tensors, sharded
tensors and objects. Tensors and objects point at *pieces*: a byte range of a data object plus
a checksum. Decoding goes through a registry of entry kinds that rejects unknown kinds instead
of silently dropping them. ``docs/format.md`` is the normative description. Entries also answer
to torchsnapshot's attribute names (``type``, ``location``...) through their ``names`` mixins.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from snapshotkit._format import torchsnapshot_names as names
from snapshotkit._format.pieces import (
    CHECKSUM_ALGORITHMS,
    METADATA_FILENAME,
    Piece,
    _fail,
    _json_string,
    validate_location,
)
from snapshotkit.errors import ManifestError

__all__ = ["CHECKSUM_ALGORITHMS", "METADATA_FILENAME", "Piece", "validate_location"]

#: Every name a take writes below a snapshot: data objects ``data/<rank>_<index>_<take id>``
#: (``_plan/layout.py``), the manifest, and the manifest's temporary file (local disk) while it is
#: being committed. Only such objects are ever deleted, or called the leftovers of a take.
OWN_OBJECT = re.compile(r"data/[0-9]+_[0-9]{5,}_[0-9a-f]+|" + re.escape(METADATA_FILENAME) + r"(\.tmp-[0-9a-f]+)?")
FORMAT_NAME = "snapshotkit"
#: The newest format version this snapshotkit writes and reads: 5, whose manifest holds its
#: entries as columns (``_format/columnar.py``); 4 gave every snapshot a unique id and every piece
#: a content hash, so that any snapshot can be the base of an incremental take (versions 1 to 4
#: are still read).
FORMAT_VERSION = 5
#: ``float.hex()`` output (and the inf/nan spellings it produces).
_FLOAT_HEX_TEXT = re.compile(r"-?(0x[0-9a-f](\.[0-9a-f]*)?p[+-][0-9]+|inf|nan)")
#: A manifest key's rank: ASCII digits without leading zeros.
_RANK_TEXT = re.compile(r"0|[1-9][0-9]*")


def escape_key(key: str | int) -> str:
    """One logical-path component for a user key: ``%`` -> ``%25``, ``/`` -> ``%2F``."""
    text = str(key)
    if "%" in text or "/" in text:
        return text.replace("%", "%25").replace("/", "%2F")
    return text


def unescape_key(component: str) -> str:
    """Inverse of :func:`escape_key` for string keys."""
    return component.replace("%2F", "/").replace("%25", "%")


def join_path(prefix: str, key: str | int) -> str:
    """The logical path of child ``key`` of the node at ``prefix`` (``""`` for the root)."""
    component = escape_key(key)
    return f"{prefix}/{component}" if prefix else component


def child_paths(prefix: str, keys: Iterable[str | int]) -> list[str]:
    """:func:`join_path` of ``prefix`` and each of ``keys``, in order: one concatenation per key
    when no key needs escaping (a container of many children names them all at once)."""
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    kinds = set(map(type, keys))
    if kinds <= {str}:
        text = "".join(keys)  # type: ignore[arg-type]
        if "%" in text or "/" in text:  # some key needs escaping
            return [join_path(prefix, key) for key in keys]
        components = keys
    elif kinds <= {int}:  # an int prints without "%" or "/"
        components = list(map(str, keys))
    else:
        return [join_path(prefix, key) for key in keys]
    return list(map(f"{prefix}/".__add__, components)) if prefix else list(components)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class TensorEntry(names.TensorNames):
    """A tensor: dtype, shape and the pieces that hold its bytes in order.

    ``serializer`` is ``"raw"`` (contiguous row-major element bytes, pieces concatenated) or
    ``"torch_save"`` (one piece of ``torch.save`` bytes, for quantized/sparse/subclass tensors).
    """

    kind: ClassVar[str] = "tensor"
    dtype: str
    shape: tuple[int, ...]
    serializer: str
    pieces: tuple[Piece, ...]
    replicated: bool = False

    # Plain properties, not cached: a restore of many small tensors asks each entry once, and
    # functools.cached_property costs more than the sum over a piece or two.
    @property
    def nbytes(self) -> int:
        pieces = self.pieces
        if len(pieces) == 1:
            return pieces[0].nbytes
        return sum(piece.nbytes for piece in pieces)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "serializer": self.serializer,
            "replicated": self.replicated,
            "pieces": [piece.to_json() for piece in self.pieces],
        }

    def to_json_line(self) -> str:
        """``to_json()`` as compact JSON text, built directly (manifests hold many tensors)."""
        shape = ",".join(map(str, self.shape))
        pieces = ",".join(piece.to_json_line() for piece in self.pieces)
        return (
            f'{{"kind":"tensor","dtype":{_json_string(self.dtype)},"shape":[{shape}],'
            f'"serializer":{_json_string(self.serializer)},"replicated":{"true" if self.replicated else "false"},'
            f'"pieces":[{pieces}]}}'
        )

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> TensorEntry:
        # Manifests hold many tensors: the usual types pass with one check each; anything else
        # goes through _field, which names what is wrong.
        dtype = raw.get("dtype")
        if type(dtype) is not str:
            dtype = _field(key, raw, "dtype", str)
        shape = raw.get("shape")
        if type(shape) is not list:
            shape = _field(key, raw, "shape", list)
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise _fail(key, f"shape {shape!r} is not a list of non-negative integers")
        serializer = raw.get("serializer")
        if serializer != "raw" and serializer != "torch_save":
            serializer = _field(key, raw, "serializer", str)
            raise _fail(key, f"serializer {serializer!r} is not 'raw' or 'torch_save'")
        raw_pieces = raw.get("pieces")
        if type(raw_pieces) is not list:
            raw_pieces = _field(key, raw, "pieces", list)
        pieces = tuple([Piece.from_json(key, p) for p in raw_pieces])
        if serializer == "torch_save" and len(pieces) != 1:
            raise _fail(key, "a torch_save tensor must have exactly one piece")
        replicated = raw.get("replicated", False)
        if type(replicated) is not bool:
            replicated = _field(key, raw, "replicated", bool, False)
        return cls(dtype, tuple(shape), serializer, pieces, replicated)


@dataclasses.dataclass(frozen=True)
class ObjectEntry(names.ObjectNames):
    """A picklable object stored as ``torch.save`` bytes in one piece."""

    kind: ClassVar[str] = "object"
    obj_type: str
    piece: Piece
    replicated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "obj_type": self.obj_type,
            "replicated": self.replicated,
            "piece": self.piece.to_json(),
        }

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> ObjectEntry:
        return cls(
            _field(key, raw, "obj_type", str),
            Piece.from_json(key, raw.get("piece")),
            _field(key, raw, "replicated", bool, False),
        )


_PRIMITIVE_TYPES = ("int", "float", "str", "bool", "bytes", "none")


@dataclasses.dataclass(frozen=True)
class PrimitiveEntry(names.PrimitiveNames):
    """A primitive stored inline in the manifest: int, float (exactly), str, bool, bytes, None."""

    kind: ClassVar[str] = "primitive"
    value_type: str
    value: Any
    replicated: bool = False

    @classmethod
    def of(cls, value: Any, replicated: bool = False) -> PrimitiveEntry:
        if value is None:
            return cls("none", None, replicated)
        return cls(type(value).__name__, value, replicated)

    def to_json(self) -> dict[str, Any]:
        encoded: Any = self.value
        out: dict[str, Any] = {"kind": self.kind, "type": self.value_type}
        if self.value_type == "float":
            encoded = float.hex(self.value)
            out["readable"] = repr(self.value)
        elif self.value_type == "bytes":
            encoded = base64.b64encode(self.value).decode("ascii")
        out["value"] = encoded
        out["replicated"] = self.replicated
        return out

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> PrimitiveEntry:
        value_type = _field(key, raw, "type", str)
        encoded = raw.get("value")
        value: Any
        if value_type == "int" and type(encoded) is int:
            value = encoded
        elif value_type == "float" and isinstance(encoded, str) and _FLOAT_HEX_TEXT.fullmatch(encoded):
            value = float.fromhex(encoded)
        elif (value_type == "str" and isinstance(encoded, str)) or (value_type == "bool" and isinstance(encoded, bool)):
            value = encoded
        elif value_type == "bytes" and isinstance(encoded, str):
            try:
                value = base64.b64decode(encoded, validate=True)
            except ValueError:
                raise _fail(key, "bytes value is not base64") from None
        elif value_type == "none" and "value" in raw and encoded is None:
            value = None
        else:
            raise _fail(key, f"primitive type {value_type!r} with value {encoded!r} is not one of {_PRIMITIVE_TYPES}")
        return cls(value_type, value, _field(key, raw, "replicated", bool, False))


@dataclasses.dataclass(frozen=True)
class DictEntry(names.DictNames):
    """A ``dict`` (or ``OrderedDict`` when ``ordered``); ``keys`` keeps order and str/int type."""

    kind: ClassVar[str] = "dict"
    keys: tuple[str | int, ...]
    ordered: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kind": "ordered_dict" if self.ordered else "dict", "keys": list(self.keys)}

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> DictEntry:
        keys = _field(key, raw, "keys", list)
        if not set(map(type, keys)) <= {str, int}:  # JSON gives exactly these (bool is not int here)
            raise _fail(key, "dict keys must be strings or integers")
        return cls(tuple(keys), raw["kind"] == "ordered_dict")


@dataclasses.dataclass(frozen=True)
class ListEntry(names.ListNames):
    """A ``list`` of ``length`` children named ``0`` .. ``length - 1``."""

    kind: ClassVar[str] = "list"
    length: int

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "length": self.length}

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> ListEntry:
        length = _field(key, raw, "length", int)
        if length < 0:
            raise _fail(key, "length must be non-negative")
        return cls(length)


@dataclasses.dataclass(frozen=True)
class TupleEntry(names.TupleNames, ListEntry):
    """A ``tuple`` of ``length`` children named ``0`` .. ``length - 1``."""

    kind: ClassVar[str] = "tuple"


@dataclasses.dataclass(frozen=True)
class Shard:
    """One stored block of a sharded tensor: the box ``offsets`` / ``sizes`` of the global tensor.

    Its elements are stored row-major and contiguous, split into pieces of whole dim-0 rows
    (so each piece is itself a box of the global tensor).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    pieces: tuple[Piece, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "offsets": list(self.offsets),
            "sizes": list(self.sizes),
            "pieces": [piece.to_json() for piece in self.pieces],
        }

    @classmethod
    def from_json(cls, key: str, raw: object, ndim: int) -> Shard:
        if not isinstance(raw, dict):
            raise _fail(key, f"shard {raw!r} is not a mapping")
        offsets = _field(key, raw, "offsets", list)
        sizes = _field(key, raw, "sizes", list)
        for name, values in (("offsets", offsets), ("sizes", sizes)):
            if len(values) != ndim or not all(type(v) is int and v >= 0 for v in values):
                raise _fail(key, f"shard {name} {values!r} is not {ndim} non-negative integers")
        pieces = tuple(Piece.from_json(key, p) for p in _field(key, raw, "pieces", list))
        return cls(tuple(offsets), tuple(sizes), pieces)


@dataclasses.dataclass(frozen=True)
class ShardedTensorEntry(names.ShardedTensorNames):
    """A tensor stored as shards (a ``DTensor`` or ``ShardedTensor``): global dtype and shape,
    and the stored boxes, which together cover it exactly once (format version 2).

    ``layout`` is informative: how the writer's tensor was distributed (e.g. the DTensor's
    mesh shape and placements); readers reshard by box overlap and do not need it.
    """

    kind: ClassVar[str] = "sharded_tensor"
    dtype: str
    shape: tuple[int, ...]
    shards: tuple[Shard, ...]
    layout: str = ""

    @functools.cached_property
    def nbytes(self) -> int:
        return sum(piece.nbytes for shard in self.shards for piece in shard.pieces)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": self.layout,
            "shards": [shard.to_json() for shard in self.shards],
        }

    @classmethod
    def from_json(cls, key: str, raw: dict[str, Any]) -> ShardedTensorEntry:
        dtype = _field(key, raw, "dtype", str)
        shape = _field(key, raw, "shape", list)
        if not all(type(dim) is int and dim >= 0 for dim in shape):
            raise _fail(key, f"shape {shape!r} is not a list of non-negative integers")
        shards = tuple(Shard.from_json(key, s, len(shape)) for s in _field(key, raw, "shards", list))
        for shard in shards:
            if any(o + n > d for o, n, d in zip(shard.offsets, shard.sizes, shape, strict=True)):
                raise _fail(key, f"shard at {list(shard.offsets)} of size {list(shard.sizes)} exceeds shape {shape}")
        covered = sum(math.prod(shard.sizes) for shard in shards)
        if covered != math.prod(shape):
            raise _fail(key, f"shards cover {covered} elements, the shape {shape} has {math.prod(shape)}")
        return cls(dtype, tuple(shape), shards, _field(key, raw, "layout", str, ""))


ContainerEntry = DictEntry | ListEntry | TupleEntry
Entry = TensorEntry | ShardedTensorEntry | ObjectEntry | PrimitiveEntry | DictEntry | ListEntry | TupleEntry

_DECODERS: dict[str, Callable[[str, dict[str, Any]], Entry]] = {
    "tensor": TensorEntry.from_json,
    "object": ObjectEntry.from_json,
    "primitive": PrimitiveEntry.from_json,
    "dict": DictEntry.from_json,
    "ordered_dict": DictEntry.from_json,
    "list": ListEntry.from_json,
    "tuple": TupleEntry.from_json,
    "sharded_tensor": ShardedTensorEntry.from_json,
}
#: The format version that introduced each entry kind not in version 1.
_KIND_SINCE = {"sharded_tensor": 2}

_MISSING = object()
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _field(key: str, raw: Mapping[str, Any], name: str, expected: type, default: Any = _MISSING) -> Any:
    value = raw.get(name, _MISSING)
    if value is _MISSING:
        if default is not _MISSING:
            return default
        raise _fail(key, f"field {name!r} is missing")
    if expected is int and type(value) is not int:
        raise _fail(key, f"field {name!r} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise _fail(key, f"field {name!r} must be {expected.__name__}, got {type(value).__name__}")
    return value


def format_version_for(manifest: Mapping[str, Entry]) -> int:
    """The format version a take writes for ``manifest``: :data:`FORMAT_VERSION` (every take
    writes a snapshot id and content hashes, which versions 4 and 5 have, and version 5 holds any
    entry version 4 does: a tensor whose pieces lack a hash goes into its JSON rows)."""
    return FORMAT_VERSION


def decode_entry(key: str, raw: object) -> Entry:
    """Decode one manifest entry, rejecting kinds this format version does not define."""
    if not isinstance(raw, dict):
        raise _fail(key, "entry is not a mapping")
    kind = raw.get("kind")
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise _fail(key, f"unknown entry kind {kind!r}; known kinds: {sorted(_DECODERS)}")
    return decoder(key, raw)


def pieces_of(entry: Entry) -> tuple[Piece, ...]:
    """The pieces an entry's value is stored in, in order (none for containers and primitives)."""
    if isinstance(entry, TensorEntry):
        return entry.pieces
    if isinstance(entry, ObjectEntry):
        return (entry.piece,)
    if isinstance(entry, ShardedTensorEntry):
        return tuple(piece for shard in entry.shards for piece in shard.pieces)
    return ()


def is_shared(entry: Entry) -> bool:
    """Whether every rank reads ``entry`` from rank 0: a replicated leaf or a sharded tensor."""
    return isinstance(entry, ShardedTensorEntry) or bool(getattr(entry, "replicated", False))


def check_containers(manifest: Mapping[str, Entry]) -> None:
    """Every child a container names must have an entry of its own, under the container's rank
    or, for a replicated or sharded leaf, under rank 0; and every entry below a top-level key
    must be named by a container (an entry nothing reaches would be dropped silently)."""
    reached: set[str] = set()
    for key, entry in manifest.items():
        if isinstance(entry, DictEntry):
            children = [join_path(key, k) for k in entry.keys]
        elif isinstance(entry, ListEntry):
            if entry.length > len(manifest):  # each child needs an entry: refuse before building names
                raise _fail(key, f"length {entry.length} exceeds the {len(manifest)} entries of the manifest")
            children = [join_path(key, i) for i in range(entry.length)]
        else:
            continue
        if len(set(children)) != len(children):
            raise ManifestError(f"malformed manifest entry {key!r}: two keys name the same child")
        for child in children:
            if child in manifest:
                reached.add(child)
                continue
            shared_key = "0/" + child.split("/", 1)[1]
            shared = manifest.get(shared_key)
            if shared is not None and is_shared(shared):
                reached.add(shared_key)
                continue
            raise ManifestError(
                f"malformed manifest entry {key!r}: it names child {child!r}, which has no entry; "
                "the manifest is corrupt"
            )
    for key in manifest:
        if "/" in key.split("/", 1)[1] and key not in reached:
            raise _fail(key, "no container names this entry; the manifest is corrupt")
