"""Export to safetensors: tensors only, streamed from the snapshot into their final place.

The format (safetensors README, "Format"): an 8-byte little-endian header length ``N``, ``N`` bytes
of JSON header (``{"__metadata__": {...}, key: {"dtype", "shape", "data_offsets": [begin, end]}}``,
offsets relative to the data buffer, the tensors filling it without gaps), padded with spaces so
the data starts at a multiple of 8, then the data buffer.

Each file's header is computed from the manifest alone (dtype, shape, byte size), so the whole
file is laid out before a byte of tensor data is read. The pieces are then fetched through the
restore pipeline (under the memory budget, a piece larger than the budget in budget-sized
sub-ranges with a running checksum, every checksum verified) and each consumer writes its bytes
straight to their offset in the file (``os.pwrite``), in whatever order they arrive: the export
holds at most the budget in flight, however large the snapshot or its tensors. A sharded tensor
is assembled in the file: each stored piece (whole dim-0 rows of a shard) is written as the runs
of consecutive elements it covers in the global tensor (one run for shards along dim 0).

Within a file, tensors are ordered by decreasing item size, then key (as ``safetensors`` does),
so that every tensor starts at a multiple of its item size. With ``max_shard_bytes``, the output
is a directory in the layout Hugging Face loaders read: ``model.safetensors`` when one file
suffices, else ``model-00001-of-0000N.safetensors``... and ``model.safetensors.index.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit._format.entries import Entry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import RAW
from snapshotkit._format.sharded import Box, piece_boxes
from snapshotkit._plan.flatten import unescape_key
from snapshotkit._restore.fetch import Claim, PieceRead
from snapshotkit.convert._source import Skipped, Source, Written, describe
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
PieceConsumer = Callable[[int, memoryview], None]

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
        _fsync(out)
        return Written(tensors, self.skipped)


def plan(selected: dict[str, Entry], strip_prefix: str | None, max_shard_bytes: int | None) -> SafetensorsPlan:
    """Lay out the export of the ``selected`` leaves.

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
        shown = "; ".join(f"{p!r}: {r}" for p, r in list(skipped.items())[:3])
        raise ConfigError(
            f"nothing to export to safetensors: none of the {len(selected)} selected logical path(s) holds a tensor "
            f"safetensors can hold ({shown}{' ...' if len(skipped) > 3 else ''}); select tensors, or use to='torch'"
        )
    if max_shard_bytes is None:
        return SafetensorsPlan((_layout("", tensors),), False, skipped)
    groups = list(_shards(tensors, max_shard_bytes))
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


def _pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    view = memoryview(data)
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_bytes(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(source: Source, file: _File, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _pwrite_all(fd, file.header, 0)
        os.ftruncate(fd, file.size)
        claims: list[Claim] = []
        reads: list[PieceRead] = []
        for tensor, offset in zip(file.tensors, file.offsets, strict=True):
            _plan_reads(fd, len(file.header) + offset, tensor, claims, reads)
        source.stream(claims, reads)
        os.fsync(fd)
    finally:
        os.close(fd)


def _plan_reads(fd: int, start: int, tensor: _Tensor, claims: list[Claim], reads: list[PieceRead]) -> None:
    """The reads that write ``tensor``'s bytes at ``start`` of the file ``fd``."""
    entry, itemsize, path = tensor.entry, tensor.itemsize, tensor.logical_path
    if isinstance(entry, TensorEntry):
        offset = 0
        for piece in entry.pieces:
            consume = _contiguous_writer(fd, start + offset)
            reads.append(PieceRead(piece, path, consume=consume, splittable=True, itemsize=itemsize))
            offset += piece.nbytes
        claims.extend(Claim(path, piece, False) for piece in entry.pieces if piece.nbytes)
        return
    for shard in entry.shards:
        sizes = [piece.nbytes for piece in shard.pieces]
        for piece, box in zip(shard.pieces, piece_boxes(Box(shard.offsets, shard.sizes), sizes, itemsize), strict=True):
            consume = _box_writer(fd, start, entry.shape, box, itemsize)
            reads.append(PieceRead(piece, path, consume=consume, splittable=True, itemsize=itemsize))
        claims.extend(Claim(path, piece, False) for piece in shard.pieces if piece.nbytes)


def _contiguous_writer(fd: int, start: int) -> PieceConsumer:
    def consume(within: int, data: memoryview) -> None:
        _pwrite_all(fd, data, start + within)

    return consume


def _box_writer(fd: int, start: int, shape: tuple[int, ...], box: Box, itemsize: int) -> PieceConsumer:
    """Writes elements of ``box`` (row-major, from any element on) where they sit in the global tensor."""

    def consume(within: int, data: memoryview) -> None:
        first = within // itemsize
        position = 0
        for global_element, count in box_runs(shape, box, first, first + data.nbytes // itemsize):
            nbytes = count * itemsize
            _pwrite_all(fd, data[position : position + nbytes], start + global_element * itemsize)
            position += nbytes

    return consume


def box_runs(shape: Sequence[int], box: Box, first: int, stop: int) -> Iterator[tuple[int, int]]:
    """``(global element index, count)`` of the runs of consecutive global elements that elements
    ``[first, stop)`` of ``box`` (counted row-major within the box) occupy in a tensor of ``shape``.

    Dimensions after ``split`` span the whole tensor, so a run is ``prod(box.sizes[split:])``
    elements: the whole box when it cuts only dim 0, one row of the last dimension when it cuts
    that one too.
    """
    ndim = len(shape)
    split = ndim - 1
    while split > 0 and box.sizes[split] == shape[split]:
        split -= 1
    strides = [math.prod(shape[d + 1 :]) for d in range(ndim)]
    run = math.prod(box.sizes[split:]) if ndim else 1
    index = first
    while index < stop:
        number, within = divmod(index, run)
        base = box.offsets[split] * strides[split] if ndim else 0
        for d in range(split - 1, -1, -1):  # the run's position in dims before ``split``
            number, coordinate = divmod(number, box.sizes[d])
            base += (box.offsets[d] + coordinate) * strides[d]
        count = min(run - within, stop - index)
        yield base + within, count
        index += count
