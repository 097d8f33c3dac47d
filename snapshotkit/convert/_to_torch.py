"""Export to one ``torch.save`` file: ``torch.load(f, weights_only=True)`` gives the nested state dicts.

The file is torch's zip format, written by the writer ``torch.save`` itself uses
(``torch._C.PyTorchFileWriter``, which adds the zip checksums and aligns each record): a pickle,
``data.pkl``, holding the containers, primitives and objects, then one record per tensor
storage. The pickle is made first, each tensor of the snapshot standing in as a placeholder that
pickles exactly as torch pickles a tensor (``torch._utils._rebuild_tensor_v2``, or ``_v3`` for the
newer dtypes, of a storage record); the records follow one by one, each tensor read from the
snapshot just before its record is written and dropped after. So the export holds tensors of at
most the memory budget at once, or one tensor when a tensor alone is larger (a sharded tensor is
assembled whole first). Objects and ``torch_save`` tensors (quantized, sparse, subclasses) are
loaded up front, under restore's ``weights_only`` rule, since they are part of the pickle.

Tensors stored with identical pieces (tied weights) share one storage record, so they load tied,
as ``restore`` keeps them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import math
import os
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from snapshotkit._format.entries import ObjectEntry, Piece, PrimitiveEntry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import RAW, dtype_from_name
from snapshotkit.convert._export_source import Skipped, Source, Tree, Written, describe
from snapshotkit.errors import ManifestError

#: Alignment of storage records in the zip, as ``torch.save`` writes them (lets ``torch.load(mmap=True)`` map them).
STORAGE_ALIGNMENT = 64
#: ``torch.save``'s pickle protocol (``torch.serialization.DEFAULT_PROTOCOL``).
PICKLE_PROTOCOL = 2


@dataclasses.dataclass(frozen=True)
class _StorageKind:
    """How torch pickles a tensor of one dtype: the rebuild function, the arguments after the
    hooks (the dtype, for ``_rebuild_tensor_v3``), the storage class named in the persistent id,
    and whether that id counts bytes (``UntypedStorage``) or elements."""

    rebuild: Any
    extra_args: tuple[Any, ...]
    storage_type: Any
    counts_bytes: bool


@functools.cache  # a snapshot has few dtypes and many tensors
def storage_kind(dtype_name: str) -> _StorageKind | None:
    """How ``torch.save`` stores tensors of ``dtype_name``; None if it cannot (``int4``...)."""
    dtype = dtype_from_name(dtype_name)
    try:
        prototype: Any = torch.empty(0, dtype=dtype)
        rebuild, args = prototype.__reduce_ex__(PICKLE_PROTOCOL)
        storage: Any = args[0]
        if isinstance(storage, torch.storage.TypedStorage):
            return _StorageKind(rebuild, tuple(args[6:]), _typed_storage_class(storage), False)
        return _StorageKind(rebuild, tuple(args[6:]), type(storage), True)
    except (KeyError, RuntimeError, AttributeError, TypeError):
        return None


def _typed_storage_class(storage: Any) -> Any:
    """The legacy storage class (``torch.FloatStorage``...) torch names for a typed storage; raises
    ``KeyError`` for dtypes ``torch.save`` cannot store."""
    return getattr(torch, storage._pickle_storage_type())


def _typed_storage_size(storage: Any) -> int:
    return int(storage._size())


def torch_save_refusal(dtype_name: str) -> str | None:
    """Why a tensor of ``dtype_name`` cannot go through ``torch.save``, or None."""
    if storage_kind(dtype_name) is None:
        return f"dtype {dtype_name} cannot be stored by torch.save (torch {torch.__version__})"
    return None


class _Placeholder:
    """A tensor of the output, pickled as a reference to a storage record written later."""

    __slots__ = ("entry", "kind", "logical_path", "shape")

    def __init__(self, logical_path: str, entry: TensorEntry | ShardedTensorEntry, kind: _StorageKind) -> None:
        self.logical_path, self.entry, self.kind, self.shape = logical_path, entry, kind, tuple(entry.shape)


class _StoragePlaceholder:
    __slots__ = ("placeholder",)

    def __init__(self, placeholder: _Placeholder) -> None:
        self.placeholder = placeholder


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


class _Pickler(pickle.Pickler):
    """Pickles like ``torch.save`` (``torch/serialization.py``, ``_save``): storages become
    persistent ids ``("storage", <storage class>, <record key>, "cpu", <count>)``; placeholders
    pickle as tensors of a storage record; tied placeholders share one record."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=PICKLE_PROTOCOL)
        #: record key -> what to write there: a placeholder (read from the snapshot) or a real storage.
        self.records: dict[str, _Placeholder | torch.UntypedStorage] = {}
        self._keys: dict[Any, str] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Placeholder):
            args = (_StoragePlaceholder(obj), 0, obj.shape, _contiguous_stride(obj.shape), False)
            return obj.kind.rebuild, (*args, collections.OrderedDict(), *obj.kind.extra_args)
        return NotImplemented

    def _key(self, identity: Any, record: _Placeholder | torch.UntypedStorage) -> str:
        key = self._keys.get(identity)
        if key is None:
            key = self._keys[identity] = str(len(self._keys))
            self.records[key] = record
        return key

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StoragePlaceholder):
            placeholder = obj.placeholder
            entry = placeholder.entry
            numel = math.prod(entry.shape)
            key = self._key(_tie_key(placeholder.logical_path, entry), placeholder)
            count = numel * dtype_from_name(entry.dtype).itemsize if placeholder.kind.counts_bytes else numel
            return ("storage", placeholder.kind.storage_type, key, "cpu", count)
        storage: Any = obj
        if isinstance(obj, torch.storage.TypedStorage):
            untyped = storage._untyped_storage
            key = self._key(("real", untyped._cdata), untyped)
            return ("storage", _typed_storage_class(storage), key, "cpu", _typed_storage_size(storage))
        if isinstance(obj, torch.UntypedStorage):
            key = self._key(("real", storage._cdata), storage)
            serialization: Any = torch.serialization
            return ("storage", serialization.normalize_storage_type(type(storage)), key, "cpu", storage.nbytes())
        return None


def _tie_key(logical_path: str, entry: TensorEntry | ShardedTensorEntry) -> Any:
    """Entries that share their first piece share every piece (a take never overlaps two payloads'
    pieces): with the same dtype and shape they are one tensor (tied weights)."""
    if isinstance(entry, TensorEntry) and entry.pieces:
        first: Piece = entry.pieces[0]
        return ("stored", first.address, first.byte_range, entry.dtype, entry.shape)
    return ("stored", logical_path)


def load_values(source: Source, tree: Tree, *, torch_save_tensors: bool = True) -> tuple[dict[str, Any], Skipped]:
    """Primitives, and objects (and ``torch_save`` tensors) loaded under the ``weights_only`` rule;
    what was refused, with why."""
    values: dict[str, Any] = {}
    blobs: dict[str, Piece] = {}
    for path, entry in tree.leaves.items():
        if isinstance(entry, PrimitiveEntry):
            values[path] = entry.value
        elif isinstance(entry, ObjectEntry):
            blobs[path] = entry.piece
        elif isinstance(entry, TensorEntry) and entry.serializer != RAW and torch_save_tensors:
            blobs[path] = entry.pieces[0]
    loaded, refused = source.load_blobs(blobs) if blobs else ({}, {})
    for path, value in loaded.items():
        if isinstance(tree.leaves[path], TensorEntry) and not isinstance(value, torch.Tensor):
            raise ManifestError(f"{path!r} is recorded as a tensor but holds a {type(value).__name__}")
    values.update(loaded)
    return values, refused


def write(source: Source, tree: Tree, out: Path) -> Written:
    """Write ``tree`` as one ``torch.save`` file at ``out``."""
    values, skipped = load_values(source, tree)
    for path, entry in tree.leaves.items():
        if isinstance(entry, (TensorEntry, ShardedTensorEntry)) and path not in values and path not in skipped:
            kind = storage_kind(entry.dtype)
            if kind is None:
                skipped[path] = f"{describe(entry)} of dtype {entry.dtype}, which torch.save cannot store"
            else:
                values[path] = _Placeholder(path, entry, kind)
    tree, lost = tree.without(skipped)
    skipped.update(lost)
    pickled = io.BytesIO()
    pickler = _Pickler(pickled)
    pickler.dump(tree.build({path: values[path] for path in tree.leaves}))
    tensors = sum(isinstance(values[path], (_Placeholder, torch.Tensor)) for path in tree.leaves)
    _write_archive(source, out, pickled.getvalue(), pickler.records)
    return Written(tensors, skipped)


def _write_archive(
    source: Source, out: Path, pickled: bytes, records: Mapping[str, _Placeholder | torch.UntypedStorage]
) -> None:
    writer = torch._C.PyTorchFileWriter(str(out), True, STORAGE_ALIGNMENT)
    try:
        writer.write_record("data.pkl", pickled, len(pickled))
        # As torch.save: records numbered in pickling order, the storage alignment, the byte order.
        writer.write_record(".format_version", b"1", 1)
        alignment = str(STORAGE_ALIGNMENT).encode()
        writer.write_record(".storage_alignment", alignment, len(alignment))
        byteorder = sys.byteorder.encode()
        writer.write_record("byteorder", byteorder, len(byteorder))
        budget = source.config.memory_budget_bytes
        batch: dict[str, _Placeholder] = {}
        batch_bytes = 0
        for key, record in records.items():
            if isinstance(record, torch.UntypedStorage):
                _flush(source, writer, batch)
                batch, batch_bytes = {}, 0
                _write_record(writer, f"data/{key}", record)
                continue
            nbytes = record.entry.nbytes
            if batch and batch_bytes + nbytes > budget:
                _flush(source, writer, batch)
                batch, batch_bytes = {}, 0
            batch[key] = record
            batch_bytes += nbytes
        _flush(source, writer, batch)
        writer.write_end_of_file()
    finally:
        del writer  # closes the file
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush(source: Source, writer: Any, batch: Mapping[str, _Placeholder]) -> None:
    """Read the tensors of ``batch`` (in one pipeline, under the budget) and write their records."""
    if not batch:
        return
    entries = {p.logical_path: p.entry for p in batch.values()}
    tensors = source.read_tensors(entries)
    for key, placeholder in batch.items():
        tensor = tensors.pop(placeholder.logical_path)
        # A new contiguous tensor of its own (fresh_tensors): its storage is exactly its bytes.
        _write_record(writer, f"data/{key}", tensor.untyped_storage())
        del tensor


def _write_record(writer: Any, name: str, storage: torch.UntypedStorage) -> None:
    """Write a CPU storage as record ``name``."""
    writer.write_record(name, storage, storage.nbytes())
