"""Export to a ``torch.distributed.checkpoint`` (DCP) directory, in one process, with DCP's own writer.

``torch.distributed.checkpoint.save`` runs with ``no_dist=True`` (no process group, whether or
not one is initialized) and a ``FileSystemWriter``. It is given the nested state dicts with a
meta tensor (no memory) standing in for every tensor; a planner (``DefaultSavePlanner`` with its
documented ``lookup_object`` extension) reads each tensor from the snapshot when the writer asks
for it, so tensors are read one at a time. A value DCP stores as bytes (a tuple, a list without
tensors of its own) has the tensors inside it read when it is serialized.

Sharded tensors keep their shards: every stored shard becomes one chunk of the DCP tensor (a
write item with the shard's offsets), read on its own, and ``dcp.load`` reassembles or reshards
them as it does for any checkpoint. DCP needs no process group for that.

Memory: ``FileSystemWriter`` keeps every tensor of a file referenced until the file is closed
(torch 2.13), so a one-file checkpoint holds the whole state at once. When the tensors add up to
more than the memory budget, every value gets a file of its own (``single_file_per_rank=False``)
and the export holds one tensor (or shard) at a time, plus the copy ``torch.save`` makes of it
inside the writer; otherwise one file holds everything.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from snapshotkit._format.entries import DictEntry, Shard, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import RAW, dtype_from_name
from snapshotkit.convert._export_source import Source, Tree, Written, describe
from snapshotkit.convert._to_torch import load_values, torch_save_refusal
from snapshotkit.errors import ConfigError

#: What ``dcp.save`` warns whenever it runs without a process group, as an export always does.
_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


def check(tree: Tree) -> None:
    """Refuse an output DCP cannot take: its top level must be a dict.

    Raises:
        ConfigError: ``strip_prefix`` names a list or tuple.
    """
    if tree.top is not None and not isinstance(tree.containers[tree.top], DictEntry):
        raise ConfigError(
            f"strip_prefix={tree.top + '/'!r} names a {tree.containers[tree.top].kind}: a DCP checkpoint holds a "
            "dict at the top; strip a shorter prefix, or export to='torch'"
        )


def write(source: Source, tree: Tree, out: Path, final: Path) -> Written:
    """Write ``tree`` as a DCP checkpoint directory at ``out``, to be renamed to ``final``."""
    values, skipped = load_values(source, tree, torch_save_tensors=False)
    lazy: dict[int, tuple[str, TensorEntry | ShardedTensorEntry, torch.Tensor]] = {}
    for path, entry in tree.leaves.items():
        if path in skipped:
            continue
        if isinstance(entry, TensorEntry) and entry.serializer != RAW:
            skipped[path] = (
                f"a {entry.dtype} tensor stored with torch.save (quantized, sparse or a tensor subclass): DCP stores "
                "dense tensors; export it with to='torch'"
            )
        elif isinstance(entry, (TensorEntry, ShardedTensorEntry)):
            reason = torch_save_refusal(entry.dtype)
            if reason is not None:
                skipped[path] = f"{describe(entry)}: {reason}"
                continue
            meta = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype), device="meta")
            lazy[id(meta)] = (path, entry, meta)
            values[path] = meta
    tree, lost = tree.without(skipped)
    skipped.update(lost)
    state = tree.build({path: values[path] for path in tree.leaves})
    kept = {key: item for key, item in lazy.items() if item[0] in tree.leaves}
    tensor_bytes = sum(entry.nbytes for _, entry, _ in kept.values())
    single_file = tensor_bytes <= source.config.memory_budget_bytes
    writer = _Writer(out, final=final, single_file=single_file)
    failure: BaseException | None = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)
            dcp_save(state, storage_writer=writer, planner=_Planner(source, kept), no_dist=True)
    except CheckpointException as exc:
        # DCP wraps what failed (a checksum mismatch, a storage error, Ctrl-C) per rank: this one
        # process's failure is the error to raise, unwrapped (outside the handler, so that it does
        # not gain the wrapper as its context).
        failures = [error for error, _ in exc.failures.values()]
        if len(failures) != 1:
            raise
        failure = failures[0]
    if failure is not None:
        raise failure
    return Written(len(kept), skipped)


class _Writer(FileSystemWriter):
    """DCP's file writer, recording the checkpoint's final path (not the temporary one it writes)."""

    def __init__(self, path: Path, *, final: Path, single_file: bool) -> None:
        super().__init__(path, single_file_per_rank=single_file, sync_files=True, thread_count=1)
        self.final = final

    def storage_meta(self) -> StorageMeta | None:
        meta = super().storage_meta()
        return dataclasses.replace(meta, checkpoint_id=self.final) if meta is not None else None


class _Planner(DefaultSavePlanner):
    """``DefaultSavePlanner`` that reads the snapshot's tensors when the writer resolves them:
    whole tensors, or one stored shard per write item of a sharded tensor."""

    def __init__(self, source: Source, lazy: Mapping[int, tuple[str, TensorEntry | ShardedTensorEntry, Any]]) -> None:
        super().__init__()
        self._source = source
        self._lazy = lazy
        self._shards: dict[tuple[str, tuple[int, ...]], Shard] = {}

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        items: list[WriteItem] = []
        for item in plan.items:
            target = self._lazy.get(id(self.state_dict.get(item.index.fqn)))
            entry = target[1] if target is not None else None
            if item.type != WriteItemType.TENSOR or not isinstance(entry, ShardedTensorEntry):
                items.append(item)
                continue
            shards = [shard for shard in entry.shards if all(shard.sizes)] or None
            if shards is None:  # no elements: the one item of the whole (empty) tensor
                items.append(item)
                continue
            for shard in shards:
                self._shards[(item.index.fqn, shard.offsets)] = shard
                items.append(_shard_item(item, shard))
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        target = self._lazy.get(id(obj))
        if target is None:
            return self._materialize(super().lookup_object(index))
        path, entry, _ = target
        offsets = tuple(index.offset) if index.offset is not None else ()
        shard = self._shards.get((index.fqn, offsets))
        if shard is not None:
            return self._source.read_shard(path, entry.dtype, shard)
        return self._source.read_tensors({path: entry})[path]

    def _materialize(self, obj: Any) -> Any:
        """``obj`` with the tensors of the snapshot inside it read (a value DCP stores as bytes)."""
        found: dict[str, TensorEntry | ShardedTensorEntry] = {}
        _placeholders(obj, self._lazy, found)
        if not found:
            return obj
        tensors = self._source.read_tensors(found)
        return _replace(obj, self._lazy, tensors)


def _shard_item(item: WriteItem, shard: Shard) -> WriteItem:
    assert item.tensor_data is not None
    offsets, sizes = torch.Size(shard.offsets), torch.Size(shard.sizes)
    return WriteItem(
        index=MetadataIndex(item.index.fqn, offsets),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
            properties=item.tensor_data.properties,
            size=item.tensor_data.size,
        ),
    )


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, dict):  # OrderedDict included
        return list(obj.values())
    if isinstance(obj, (list, tuple)):
        return list(obj)
    return []


def _placeholders(
    obj: Any, lazy: Mapping[int, tuple[str, Any, Any]], found: dict[str, TensorEntry | ShardedTensorEntry]
) -> None:
    stack = [obj]
    while stack:
        value = stack.pop()
        target = lazy.get(id(value))
        if target is not None:
            found[target[0]] = target[1]
        else:
            stack.extend(_children(value))


def _replace(obj: Any, lazy: Mapping[int, tuple[str, Any, Any]], tensors: Mapping[str, torch.Tensor]) -> Any:
    target = lazy.get(id(obj))
    if target is not None:
        return tensors[target[0]]
    if isinstance(obj, OrderedDict):
        return OrderedDict((k, _replace(v, lazy, tensors)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: _replace(v, lazy, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace(v, lazy, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_replace(v, lazy, tensors) for v in obj)
    return obj
