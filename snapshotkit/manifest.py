"""The manifest: entry types and the ``.snapshot_metadata`` document (format versions 1 and 2).

The manifest maps ``"<rank>/<logical path>"`` to one entry per node of the flattened app
state: containers (dict, ordered dict, list, tuple), inline primitives, tensors, sharded
tensors and objects. Tensors and objects point at *pieces*: a byte range of a data object plus
a checksum. ``docs/format.md`` is the normative description; the implementation lives in
``snapshotkit._format``.
"""

from __future__ import annotations

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    FORMAT_NAME,
    FORMAT_VERSION,
    METADATA_FILENAME,
    DictEntry,
    Entry,
    ListEntry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    Shard,
    ShardedTensorEntry,
    TensorEntry,
    TupleEntry,
    validate_location,
)

__all__ = [
    "DictEntry",
    "Entry",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "ListEntry",
    "METADATA_FILENAME",
    "ObjectEntry",
    "Piece",
    "PrimitiveEntry",
    "Shard",
    "ShardedTensorEntry",
    "SnapshotMetadata",
    "TensorEntry",
    "TupleEntry",
    "validate_location",
]
