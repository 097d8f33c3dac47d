"""Checkpoints of other libraries, recognized by their names and first bytes (no I/O here).

``Snapshot(path)`` on something another library wrote says what it found and the command that
converts it (:mod:`snapshotkit._restore.absent`); ``import_snapshot`` detects its source with the
same rules (:mod:`snapshotkit.convert._detect`):

    torchsnapshot  a .snapshot_metadata document with "version", "world_size" and "manifest"
                   members and no "format" member (ours always names its format)
    dcp            a .metadata file next to *.distcp files
    safetensors    a *.safetensors.index.json (a Hugging Face sharded checkpoint), or *.safetensors
                   files; a file: an 8-byte little-endian header size, then a JSON object
    torch          a zip whose first record is <archive>/data.pkl, or a pickle starting with torch's
                   legacy magic number; in a listing (names only), a *.pt, *.pth, *.bin or *.ckpt file
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import struct
from collections.abc import Iterable, Mapping

from snapshotkit._text import first_few

#: The formats ``import_snapshot(source=...)`` and ``snapshotkit import --from`` read.
SOURCE_FORMATS = ("dcp", "safetensors", "torch", "torchsnapshot")

#: DCP's metadata file (``torch.distributed.checkpoint``); its data files end in ``.distcp``.
DCP_METADATA = ".metadata"
#: The suffix of a Hugging Face sharded checkpoint's index (``model.safetensors.index.json``).
SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"
#: Largest safetensors header the format allows (its reference implementation's limit).
SAFETENSORS_MAX_HEADER_BYTES = 100_000_000
#: Bytes of a file's beginning that :func:`classify_head` needs to see.
HEAD_BYTES = 64

# torch.save's legacy (pre-1.6) format: a pickle whose first object is this magic number.
_LEGACY_TORCH_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclasses.dataclass(frozen=True)
class ForeignCheckpoint:
    """What another library left at a path.

    Attributes:
        source_format: one of :data:`SOURCE_FORMATS`.
        description: what was found, for a message ("a DCP (torch.distributed.checkpoint)
            checkpoint (.metadata and 2 .distcp files)").
        name: the object below the listed directory to import; ``""``: the directory itself.
    """

    source_format: str
    description: str
    name: str = ""


def classify_listing(names: Iterable[str]) -> ForeignCheckpoint | None:
    """The checkpoint a directory holding ``names`` (relative, ``/``-separated) is, if any.

    Only the names directly in the directory count. A ``.snapshot_metadata`` is not looked at
    here: whether it is ours or torchsnapshot's is in its content (:func:`is_torchsnapshot_document`).
    """
    top = sorted({name for name in names if "/" not in name})
    distcp = [name for name in top if name.endswith(".distcp")]
    if DCP_METADATA in top and distcp:
        return ForeignCheckpoint(
            "dcp",
            f"a DCP (torch.distributed.checkpoint) checkpoint ({DCP_METADATA} and {_count(distcp, '.distcp file')})",
        )
    indexes = [name for name in top if name.endswith(SAFETENSORS_INDEX_SUFFIX)]
    shards = [name for name in top if name.endswith(".safetensors")]
    if indexes:
        return ForeignCheckpoint(
            "safetensors",
            f"a Hugging Face sharded safetensors checkpoint ({indexes[0]} and {_count(shards, '.safetensors file')})",
            "" if len(indexes) == 1 else indexes[0],
        )
    if shards:
        shown = first_few(shards, 1, show=str) + (", each imported on its own" if len(shards) > 1 else "")
        return ForeignCheckpoint("safetensors", f"a safetensors file ({shown})", shards[0])
    torch_files = [name for name in top if name.endswith(_TORCH_SUFFIXES)]
    if torch_files:
        shown = first_few(torch_files, 1, show=str)
        return ForeignCheckpoint("torch", f"what looks like a torch.save file ({shown})", torch_files[0])
    return None


def classify_head(head: bytes, size_bytes: int | None = None) -> ForeignCheckpoint | None:
    """The checkpoint a file is, from its first :data:`HEAD_BYTES` bytes (and its size, if known)."""
    if head.startswith(b"PK\x03\x04") and len(head) >= 30:
        (name_length,) = struct.unpack_from("<H", head, 26)
        first_record = head[30 : 30 + name_length]
        if first_record.endswith(b"data.pkl") and len(first_record) == name_length:
            return ForeignCheckpoint("torch", "a torch.save file")
        return None
    if head.startswith(b"\x80") and _LEGACY_TORCH_MAGIC in head[:16]:
        return ForeignCheckpoint("torch", "a torch.save file (legacy format)")
    if len(head) >= 9:
        (header_bytes,) = struct.unpack_from("<Q", head)
        fits = size_bytes is None or 8 + header_bytes <= size_bytes
        if 2 <= header_bytes <= SAFETENSORS_MAX_HEADER_BYTES and fits and head[8:9] == b"{":
            return ForeignCheckpoint("safetensors", "a safetensors file")
    return None


def classify_file(path: str | os.PathLike[str]) -> ForeignCheckpoint | None:
    """What the local file at ``path`` is, by its first bytes; None if it is not a regular file
    (a FIFO or device could block or never end), cannot be read, or is not recognized."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            size_bytes = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    return classify_head(head, size_bytes)


def is_torchsnapshot_document(document: object) -> bool:
    """Whether a decoded ``.snapshot_metadata`` document is torchsnapshot's (not ours)."""
    return (
        isinstance(document, Mapping)
        and "format" not in document
        and isinstance(document.get("manifest"), Mapping)
        and "world_size" in document
        and "version" in document
    )


def import_command(src: str, source_format: str) -> str:
    """The shell command that converts the checkpoint at ``src`` into a snapshot."""
    return f"snapshotkit import {shlex.quote(src)} OUT --from {source_format}"


def _count(names: list[str], what: str) -> str:
    return f"{len(names)} {what}" + ("" if len(names) == 1 else "s")
