"""Export to safetensors: tensors only, streamed from the snapshot into place.

The format (safetensors README, "Format"): an 8-byte little-endian header length ``N``, ``N`` bytes
of JSON header (``{"__metadata__": {...}, key: {"dtype", "shape", "data_offsets": [begin, end]}}``,
offsets relative to the data buffer, the tensors filling it without gaps), padded with spaces so
the data starts at a multiple of 8, then the data buffer.

Each file's header is computed from the manifest alone (dtype, shape, byte size), so the whole
file is laid out before a byte of tensor data is read. The pieces are then copied in file order
through the restore pipeline (:mod:`snapshotkit._restore.fetch`: ranged reads, every checksum
verified), double-buffered within the memory budget: a window of pieces is read straight into one
of two reused buffers while a thread writes the previous window out of the other; a piece larger
than a buffer is streamed alone in budget-sized sub-ranges with a running checksum. So the
export holds at most the budget, however large the snapshot or its tensors. A sharded tensor is
assembled in the file: each stored piece (whole dim-0 rows of a shard) is written as the runs of
consecutive elements it covers in the global tensor (one run when only dim 0 is split).

Within a file, tensors are ordered by decreasing item size, then key (as ``safetensors`` does),
so that every tensor starts at a multiple of its item size. With ``max_shard_bytes`` (or a
``config=`` for transformers, :mod:`snapshotkit.convert._to_transformers`), the output is a
directory in the layout Hugging Face loaders read: ``model.safetensors`` when one file suffices,
else ``model-00001-of-0000N.safetensors``... and ``model.safetensors.index.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import Entry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import RAW
from snapshotkit._plan.flatten import unescape_key
from snapshotkit._restore.fetch import Claim
from snapshotkit._runtime.filewrite import fsync_path, preallocate, pwrite_all
from snapshotkit._text import first_few
from snapshotkit.convert._export_source import Skipped, Source, Written, describe
from snapshotkit.convert._stream import copy_pieces, spans
from snapshotkit.errors import ConfigError

#: snapshotkit dtype -> safetensors dtype, for every dtype ``safetensors.torch`` loads.
DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
}

#: safetensors refuses headers larger than this.
MAX_HEADER_BYTES = 100_000_000
SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"


@dataclasses.dataclass(frozen=True)
class _Tensor:
    key: str
    logical_path: str
    entry: TensorEntry | ShardedTensorEntry
    dtype: str  # the safetensors name

    @property
    def itemsize(self) -> int:
        return RAW_ITEMSIZE[self.entry.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.entry.shape) * self.itemsize


@dataclasses.dataclass(frozen=True)
class _File:
    """One safetensors file: its name in the output directory, its tensors in data order, their
    offsets in the data buffer, and its header (length prefix, JSON, padding)."""

    name: str
    tensors: tuple[_Tensor, ...]
    offsets: tuple[int, ...]
    header: bytes

    @property
    def size(self) -> int:
        return len(self.header) + sum(tensor.nbytes for tensor in self.tensors)


def refusal(entry: Entry) -> str | None:
    """Why safetensors cannot hold ``entry``, or None."""
    if not isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        return f"not a tensor ({describe(entry)}): safetensors holds tensors only"
    if isinstance(entry, TensorEntry) and entry.serializer != RAW:
        return (
            f"a {entry.dtype} tensor stored with torch.save (quantized, sparse or a tensor subclass): safetensors "
            "holds dense tensors of plain dtypes only"
        )
    if entry.dtype not in DTYPES:
        return f"dtype {entry.dtype} has no safetensors dtype (safetensors holds {', '.join(sorted(DTYPES))})"
    return None


def key_of(logical_path: str, strip_prefix: str | None) -> str:
    """The safetensors key of a logical path: ``strip_prefix`` removed, ``/`` -> ``.``, keys unescaped."""
    rest = logical_path[len(strip_prefix) :] if strip_prefix else logical_path
    return ".".join(unescape_key(component) for component in rest.split("/"))


@dataclasses.dataclass(frozen=True)
class SafetensorsPlan:
    """The files of a safetensors export, laid out from the manifest before anything is read.

    Attributes:
        files: the files, each with its header and layout.
        directory: the output is a directory (``max_shard_bytes`` given), else one file.
        skipped: selected leaves that are not exported, with the reason.
    """

    files: tuple[_File, ...]
    directory: bool
    skipped: Skipped

    def write(self, source: Source, out: Path) -> Written:
        """Write the export at ``out`` (a file, or a directory of files and the index)."""
        tensors = sum(len(file.tensors) for file in self.files)
        if not self.directory:
            _write_file(source, self.files[0], out)
            return Written(tensors, self.skipped)
        out.mkdir()
        for file in self.files:
            _write_file(source, file, out / file.name)
        if len(self.files) > 1:
            index = {
                "metadata": {"total_size": sum(t.nbytes for file in self.files for t in file.tensors)},
                "weight_map": {t.key: file.name for file in self.files for t in file.tensors},
            }
            _write_bytes(out / INDEX_FILE_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
        fsync_path(out)
        return Written(tensors, self.skipped)


def plan(
    selected: dict[str, Entry], strip_prefix: str | None, max_shard_bytes: int | None, *, directory: bool = False
) -> SafetensorsPlan:
    """Lay out the export of the ``selected`` leaves: one file, or with ``max_shard_bytes`` or
    ``directory`` a directory in Hugging Face's layout.

    Raises:
        ConfigError: two logical paths give the same key; nothing selected is a tensor safetensors
            can hold; a file's header would exceed safetensors' limit.
    """
    tensors: list[_Tensor] = []
    skipped: Skipped = {}
    owners: dict[str, str] = {}
    for path, entry in selected.items():
        reason = refusal(entry)
        if reason is not None:
            skipped[path] = reason
            continue
        assert isinstance(entry, (TensorEntry, ShardedTensorEntry))
        key = key_of(path, strip_prefix)
        if key in owners:
            raise ConfigError(
                f"logical paths {owners[key]!r} and {path!r} both give the safetensors key {key!r}; select only "
                "one of them (select=...) or export them with to='torch'"
            )
        owners[key] = path
        tensors.append(_Tensor(key, path, entry, DTYPES[entry.dtype]))
    if not tensors:
        shown = first_few(list(skipped.items()), 3, show=lambda item: f"{item[0]!r}: {item[1]}", separator="; ")
        raise ConfigError(
            f"nothing to export to safetensors: none of the {len(selected)} selected logical path(s) holds a tensor "
            f"safetensors can hold ({shown}); select tensors, or use to='torch'"
        )
    if max_shard_bytes is None and not directory:
        return SafetensorsPlan((_layout("", tensors),), False, skipped)
    groups = [tensors] if max_shard_bytes is None else list(_shards(tensors, max_shard_bytes))
    if len(groups) == 1:
        return SafetensorsPlan((_layout(SINGLE_FILE_NAME, groups[0]),), True, skipped)
    count = len(groups)
    files = tuple(_layout(f"model-{i:05d}-of-{count:05d}.safetensors", g) for i, g in enumerate(groups, 1))
    return SafetensorsPlan(files, True, skipped)


def _shards(tensors: Sequence[_Tensor], max_shard_bytes: int) -> Iterator[list[_Tensor]]:
    """Consecutive groups of at most ``max_shard_bytes`` (a larger tensor alone), as Hugging Face shards."""
    group: list[_Tensor] = []
    size = 0
    for tensor in tensors:
        if group and size + tensor.nbytes > max_shard_bytes:
            yield group
            group, size = [], 0
        group.append(tensor)
        size += tensor.nbytes
    if group:
        yield group


def _layout(name: str, tensors: Sequence[_Tensor]) -> _File:
    ordered = sorted(tensors, key=lambda t: (-t.itemsize, t.key))
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offsets: list[int] = []
    position = 0
    for tensor in ordered:
        offsets.append(position)
        end = position + tensor.nbytes
        header[tensor.key] = {"dtype": tensor.dtype, "shape": list(tensor.entry.shape), "data_offsets": [position, end]}
        position = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the data buffer starts at a multiple of 8
    if len(text) > MAX_HEADER_BYTES:
        raise ConfigError(
            f"the safetensors header of {len(ordered)} tensors would take {len(text)} bytes, more than the "
            f"{MAX_HEADER_BYTES} safetensors reads; pass max_shard_bytes to split the export into several files"
        )
    return _File(name, tuple(ordered), tuple(offsets), struct.pack("<Q", len(text)) + text)


def _write_bytes(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(source: Source, file: _File, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pieces = [
            span
            for tensor, offset in zip(file.tensors, file.offsets, strict=True)
            for span in spans(fd, len(file.header) + offset, tensor.logical_path, tensor.entry)
        ]
        # The data objects are proven to hold every piece before the file gets its size.
        source.prove([Claim(span.logical_path, span.piece, False) for span in pieces if span.piece.nbytes])
        preallocate(fd, file.size)
        pwrite_all(fd, file.header, 0)
        copy_pieces(source, fd, pieces)
        if os.fstat(fd).st_size != file.size:  # not preallocated, and the last tensors are empty
            os.ftruncate(fd, file.size)
        os.fsync(fd)
    finally:
        os.close(fd)
