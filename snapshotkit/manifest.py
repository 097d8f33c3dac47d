"""The manifest: entry types and the ``.snapshot_metadata`` document (format versions 1 to 3).

The manifest maps ``"<rank>/<logical path>"`` to one entry per node of the flattened app
state: containers (dict, ordered dict, list, tuple), inline primitives, tensors, sharded
tensors and objects. Tensors and objects point at *pieces*: a byte range of a data object plus
a checksum. ``docs/format.md`` is the normative description; the implementation lives in
``snapshotkit._format``.

For code written against ``torchsnapshot.manifest``, entries also answer to torchsnapshot's
attribute names where they mean the same thing, as read-only properties: ``type`` on every
entry (``"Tensor"``, ``"ShardedTensor"``, ``"object"``, ``"dict"``, ``"OrderedDict"``,
``"list"``, a primitive's type name; ``"tuple"`` for ours), ``TensorEntry.location``,
``byte_range`` and ``byte_range_tuple`` (for a tensor stored in one piece),
``ObjectEntry.location`` and ``serializer``, ``PrimitiveEntry.readable`` and ``get_value()``.
``docs/torchsnapshot.md`` lists what differs.

:func:`encode_document` and :func:`decode_document` are the one codec for the raw document
(a JSON object): they add and verify the integrity line every manifest carries from format
version 3, and parse strictly, without semantic validation. Tools use them to read or write a
manifest that passes the check; :meth:`SnapshotMetadata.from_text` adds the validation.
"""

from __future__ import annotations

from snapshotkit._format.codec import decode_document, encode_document
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
    "decode_document",
    "encode_document",
    "validate_location",
]
