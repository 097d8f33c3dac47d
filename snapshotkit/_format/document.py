"""The ``.snapshot_metadata`` document: header fields and the manifest, to and from text."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from snapshotkit._format.bases import BASES_MEMBER, BASES_SINCE, SNAPSHOT_ID_MEMBER, decode_bases
from snapshotkit._format.codec import INTEGRITY_SINCE, decode_document, seal
from snapshotkit._format.columnar import COLUMNAR_SINCE, ENTRIES_MEMBER, decode_entries
from snapshotkit._format.columnar_encode import encode_entries
from snapshotkit._format.dtypes import DTYPE_NAME, MAX_NUMEL, RAW_ITEMSIZE
from snapshotkit._format.entries import (
    _COMPACT_JSON,
    _KIND_SINCE,
    _RANK_TEXT,
    FORMAT_NAME,
    FORMAT_VERSION,
    Entry,
    ShardedTensorEntry,
    TensorEntry,
    _field,
    check_containers,
    decode_entry,
    pieces_of,
)
from snapshotkit._format.pieces import _fail, _json_string
from snapshotkit.errors import ManifestError, UnsupportedFormatVersionError

#: The optional header member that holds the take's ``metadata=`` (docs/format.md section 2.2).
USER_METADATA_MEMBER = "user_metadata"
#: The first format version that defines it.
USER_METADATA_SINCE = 3


@dataclasses.dataclass(frozen=True)
class SnapshotMetadata:
    """The decoded ``.snapshot_metadata`` document.

    Attributes:
        format_version: on-disk format version (1 to 5; a take writes 5).
        snapshotkit_version: version of the snapshotkit that wrote the snapshot.
        torch_version: ``torch.__version__`` of the writer.
        created_at: UTC time the take committed, ISO 8601.
        world_size: number of ranks that took the snapshot.
        manifest: ``"<rank>/<logical path>"`` -> entry, in flatten order; from format version 5 a
            read-only mapping that builds an entry when it is looked up
            (:class:`~snapshotkit._format.columnar.ColumnarManifest`).
        user_metadata: the ``metadata=`` rank 0 passed to the take, as stored (a JSON object);
            ``{}`` when none was given and for snapshots older than format version 3.
        snapshot_id: this snapshot's unique id (32 hex digits; format version 4, else None).
        bases: the snapshots an incremental snapshot reads reused pieces from: base location
            (``"../<name>"``) -> that base's ``snapshot_id``; ``{}`` for a self-contained snapshot.
    """

    format_version: int
    snapshotkit_version: str
    torch_version: str
    created_at: str
    world_size: int
    manifest: Mapping[str, Entry]
    user_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    snapshot_id: str | None = None
    bases: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def version(self) -> str:
        """The writer's snapshotkit version (torchsnapshot's name for it)."""
        return self.snapshotkit_version

    def to_json_text(self) -> str:
        """The manifest document as JSON text, one entry per line, as a take writes it.

        From format version 3 the text begins with its integrity line (``docs/format.md``
        section 2.1); :meth:`to_bytes` is the same text as UTF-8.
        """
        return self.to_bytes().decode("utf-8")

    def to_bytes(self) -> bytes:
        """The manifest document as the UTF-8 bytes a take writes to ``.snapshot_metadata``.

        Raises:
            ValueError: ``user_metadata`` is not empty and ``format_version`` is below 3, which
                has no such member.
        """
        head: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "snapshotkit_version": self.snapshotkit_version,
            "torch_version": self.torch_version,
            "created_at": self.created_at,
            "world_size": self.world_size,
        }
        if self.format_version >= BASES_SINCE:
            if self.snapshot_id is None:
                raise ValueError(f"format version {self.format_version} needs a snapshot_id")
            head[SNAPSHOT_ID_MEMBER] = self.snapshot_id
            if self.bases:
                head[BASES_MEMBER] = self.bases
        elif self.bases:
            raise ValueError(f"bases need format version {BASES_SINCE}; this document is version {self.format_version}")
        if self.user_metadata:
            if self.format_version < USER_METADATA_SINCE:
                raise ValueError(
                    f"user_metadata needs format version {USER_METADATA_SINCE}; this document is version "
                    f"{self.format_version}"
                )
            head[USER_METADATA_MEMBER] = self.user_metadata
        encode = _COMPACT_JSON.encode
        lines = ["{"]
        lines.extend(f"{json.dumps(k)}: {json.dumps(v, allow_nan=False)}," for k, v in head.items())
        if self.format_version >= COLUMNAR_SINCE:
            columns = encode_entries(self.manifest)
            rows = columns.pop("rows")
            lines.append(f'"{ENTRIES_MEMBER}": {{')
            lines.extend(f"{_json_string(name)}: {encode(value)}," for name, value in columns.items())
            lines.append('"rows": [' + ",\n".join(encode(row) for row in rows) + "]")
            lines.append("}")
        elif self.manifest:
            lines.append('"manifest": {')
            body = [
                f"{_json_string(k)}: {e.to_json_line() if isinstance(e, TensorEntry) else encode(e.to_json())}"
                for k, e in self.manifest.items()
            ]
            lines.append(",\n".join(body))
            lines.append("}")
        else:
            lines.append('"manifest": {}')
        lines.append("}")
        text = "\n".join(lines) + "\n"
        if self.format_version < INTEGRITY_SINCE:
            return text.encode("utf-8")
        return seal(text.removeprefix("{\n").encode("utf-8"))

    @classmethod
    def from_text(cls, text: str | bytes) -> SnapshotMetadata:
        """Verify and decode a manifest document (``.snapshot_metadata`` bytes or text).

        Raises:
            ManifestIntegrityError: the manifest fails its integrity check.
            UnsupportedFormatVersionError: a newer format version than this snapshotkit reads.
            ManifestError: anything else malformed; the message names the entry.
        """
        document = decode_document(text.encode("utf-8") if isinstance(text, str) else text)
        if document.get("format") != FORMAT_NAME:
            raise ManifestError(
                f"the manifest's format is {document.get('format')!r}, not {FORMAT_NAME!r}; "
                "this is not a snapshotkit snapshot. If another library wrote it, convert it into one with "
                "snapshotkit import SRC OUT (--from torchsnapshot for a torchsnapshot snapshot)"
            )
        version = document.get("format_version")
        if type(version) is not int or version < 1:
            raise ManifestError(f"format_version {version!r} is not a positive integer")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatVersionError(
                f"this snapshot was written by a newer snapshotkit ({document.get('snapshotkit_version')!r}, format "
                f"version {version}); this snapshotkit reads format versions up to {FORMAT_VERSION}. "
                "Upgrade: pip install -U snapshotkit"
            )
        head: dict[str, Any] = {}
        for name, expected in (
            ("snapshotkit_version", str),
            ("torch_version", str),
            ("created_at", str),
            ("world_size", int),
        ):
            head[name] = _field("<header>", document, name, expected)
        if head["world_size"] < 1:
            raise ManifestError(f"world_size {head['world_size']!r} must be at least 1")
        if version >= USER_METADATA_SINCE:  # before version 3 an unknown member, ignored
            user_metadata = document.get(USER_METADATA_MEMBER, {})
            if not isinstance(user_metadata, dict):
                raise ManifestError(
                    f"the header member {USER_METADATA_MEMBER!r} must be a JSON object, got "
                    f"{type(user_metadata).__name__} {str(user_metadata)[:80]}"
                )
            head["user_metadata"] = user_metadata
        head["snapshot_id"], head["bases"] = decode_bases(document, version)
        if version >= COLUMNAR_SINCE:
            bases = head["bases"]

            def check_row(key: str, entry: Entry) -> None:
                if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
                    _check_tensor(key, entry)
                _check_pieces(key, entry, version, bases)

            columnar = decode_entries(
                document.get(ENTRIES_MEMBER), world_size=head["world_size"], bases=bases, check_row=check_row
            )
            return cls(format_version=version, manifest=columnar, **head)
        raw_manifest = _field("<header>", document, "manifest", dict)
        manifest: dict[str, Entry] = {}
        ranks_seen: set[str] = set()  # a manifest has many keys and few ranks: check each rank once
        for key, raw in raw_manifest.items():
            rank, slash, _ = key.partition("/") if isinstance(key, str) else ("", "", "")
            if not slash or (
                rank not in ranks_seen and (_RANK_TEXT.fullmatch(rank) is None or int(rank) >= head["world_size"])
            ):
                raise ManifestError(
                    f"manifest key {key!r} is not '<rank>/<logical path>' with rank < world_size {head['world_size']}"
                )
            ranks_seen.add(rank)
            entry = decode_entry(key, raw)
            if _KIND_SINCE.get(entry.kind, 1) > version:
                raise _fail(
                    key,
                    f"entry kind {entry.kind!r} needs format version {_KIND_SINCE[entry.kind]}, "
                    f"the manifest says {version}",
                )
            if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
                _check_tensor(key, entry)
            _check_pieces(key, entry, version, head["bases"])
            manifest[key] = entry
        check_containers(manifest)
        return cls(format_version=version, manifest=manifest, **head)


def _check_pieces(key: str, entry: Entry, version: int, bases: dict[str, str]) -> None:
    """Hashes and base references only from version 4; a reference names a base of the header."""
    pieces = entry.pieces if isinstance(entry, TensorEntry) else pieces_of(entry)
    if version >= BASES_SINCE and all(piece.base is None for piece in pieces):
        return  # the usual case, checked in one pass
    for piece in pieces:
        if version < BASES_SINCE and (piece.hash is not None or piece.base is not None):
            raise _fail(
                key, f"a piece has a hash or base, which need format version {BASES_SINCE}; the manifest says {version}"
            )
        if piece.base is not None and piece.base not in bases:
            raise _fail(
                key, f"a piece references base {piece.base!r}, which the header's {BASES_MEMBER!r} does not list"
            )


def _check_tensor(key: str, entry: TensorEntry | ShardedTensorEntry) -> None:
    """Dtype, shape and byte counts of a tensor entry agree before any byte is read or allocated."""
    if entry.dtype not in RAW_ITEMSIZE and DTYPE_NAME.fullmatch(entry.dtype) is None:
        raise _fail(key, f"dtype {entry.dtype!r} is not a torch dtype name")
    numel = extent = 1
    for dim in entry.shape:
        numel *= dim
        extent *= max(dim, 1)  # strides multiply the sizes, zeros aside: they must fit too
        if extent > MAX_NUMEL:
            raise _fail(key, f"shape {list(entry.shape)} has more elements than torch can index")
    raw = isinstance(entry, ShardedTensorEntry) or entry.serializer == "raw"
    if not raw:
        return
    itemsize = RAW_ITEMSIZE.get(entry.dtype)
    if itemsize is None:
        raise _fail(
            key,
            f"dtype {entry.dtype!r} cannot be stored raw (docs/format.md section 4.1 lists the raw dtypes); "
            "the manifest is corrupt or crafted",
        )
    if isinstance(entry, TensorEntry):
        if len(entry.pieces) == 1:  # the usual case: a whole number of elements once it holds them all
            if entry.pieces[0].nbytes != numel * itemsize:
                raise _fail(
                    key,
                    f"pieces hold {entry.pieces[0].nbytes} bytes but {numel} element(s) of dtype {entry.dtype} "
                    f"need {numel * itemsize}",
                )
            return
        blocks = [(numel, itemsize, entry.pieces)]
    else:
        blocks = [
            (math.prod(shard.sizes), math.prod(shard.sizes[1:]) * itemsize, shard.pieces) for shard in entry.shards
        ]
    for count, unit, pieces in blocks:
        total = sum(piece.nbytes for piece in pieces)
        if total != count * itemsize:
            raise _fail(
                key,
                f"pieces hold {total} bytes but {count} element(s) of dtype {entry.dtype} need {count * itemsize}",
            )
        if unit and any(piece.nbytes % unit for piece in pieces):
            raise _fail(key, f"a piece's length is not a multiple of {unit} bytes (whole elements or rows)")
