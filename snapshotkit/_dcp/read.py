"""A DCP load from a snapshot: DCP's metadata from the manifest, DCP's read items through the
restore pipeline.

:func:`dcp_view` describes every leaf of the snapshot's rank-0 view to DCP, under the FQN DCP
would flatten its keys to (``model/layer1.weight`` -> ``"model.layer1.weight"``): a tensor (plain
or sharded) as one chunk covering it, anything else as bytes. No pickle is read: the metadata is
the manifest's. DCP's load planner then asks for regions of those chunks, and
:func:`read_items` fills each region through :class:`~snapshotkit._restore.place.LeafLoader`
(only the stored pieces that overlap it are read, ranged, under the memory budget, every piece's
checksum verified) before handing it to the planner, as DCP's own readers do.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner

from snapshotkit._config import Config
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    ObjectEntry,
    PrimitiveEntry,
    ShardedTensorEntry,
    TensorEntry,
    unescape_key,
)
from snapshotkit._format.serialization import dtype_from_name, serialize_object
from snapshotkit._format.sharded import Box, LocalChunks
from snapshotkit._restore.engine import fetch_planned
from snapshotkit._restore.metadata import OpenPlugin
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import rank_view
from snapshotkit.errors import LogicalPathNotFoundError, UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class DcpView:
    """A snapshot as DCP sees it.

    Attributes:
        metadata: DCP's metadata of the snapshot.
        paths: FQN -> logical path.
        entries: logical path -> manifest entry (the rank-0 view).
    """

    metadata: Metadata
    paths: Mapping[str, str]
    entries: Mapping[str, Entry]


def _keys(view: Mapping[str, Entry], logical_path: str) -> tuple[str | int, ...]:
    """The nested keys of ``logical_path``: ``str`` or ``int`` as the containers recorded them."""
    parts = logical_path.split("/")
    keys: list[str | int] = [unescape_key(parts[0])]
    for depth in range(1, len(parts)):
        parent = view.get("/".join(parts[:depth]))
        text = unescape_key(parts[depth])
        if (isinstance(parent, ListEntry) and text.isdigit()) or (
            isinstance(parent, DictEntry) and text.lstrip("-").isdigit() and int(text) in parent.keys
        ):
            keys.append(int(text))
        else:
            keys.append(text)
    return tuple(keys)


def _int_text(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _tensor_metadata(dtype: str, shape: tuple[int, ...]) -> TensorStorageMetadata:
    size = torch.Size(shape)
    whole = ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)
    return TensorStorageMetadata(properties=TensorProperties(dtype=dtype_from_name(dtype)), size=size, chunks=[whole])


def dcp_view(snapshot: SnapshotMetadata, checkpoint_id: str) -> DcpView:
    """DCP's view of ``snapshot`` (module docstring).

    Raises:
        UnsupportedValueError: two logical paths flatten to one FQN (keys holding ``.`` at
            different depths, such as ``a.b/c`` and ``a/b.c``).
    """
    view = rank_view(snapshot, 0)
    described: dict[str, Any] = {}
    planner_data: dict[str, tuple[str | int, ...]] = {}
    paths: dict[str, str] = {}
    for logical, entry in view.items():
        if isinstance(entry, (DictEntry, ListEntry)):
            continue
        keys = _keys(view, logical)
        fqn = ".".join(str(key) for key in keys)
        if fqn in paths:
            raise UnsupportedValueError(
                f"the logical paths {paths[fqn]!r} and {logical!r} of the snapshot at {checkpoint_id!r} both flatten "
                f"to the DCP key {fqn!r}; load this snapshot with Snapshot.restore or read_object instead"
            )
        paths[fqn], planner_data[fqn] = logical, keys
        if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
            described[fqn] = _tensor_metadata(entry.dtype, entry.shape)
        else:
            described[fqn] = BytesStorageMetadata()
    metadata = Metadata(
        state_dict_metadata=described,
        planner_data=planner_data,
        storage_meta=StorageMeta(checkpoint_id=checkpoint_id),
    )
    return DcpView(metadata, paths, view)


def _entry(view: DcpView, fqn: str, checkpoint_id: str) -> tuple[str, Entry]:
    logical = view.paths.get(fqn)
    if logical is None:
        raise LogicalPathNotFoundError(
            f"DCP asked for {fqn!r}, which the snapshot at {checkpoint_id!r} does not hold; "
            "load with the state dict the snapshot was saved from"
        )
    return logical, view.entries[logical]


def read_items(
    view: DcpView, plan: LoadPlan, planner: LoadPlanner, *, path: str, open_plugin: OpenPlugin, config: Config
) -> None:
    """Fill every read item of ``plan`` from the snapshot at ``path`` (module docstring).

    Raises:
        IntegrityError: a stored piece does not match its checksum (the message names its logical path).
        StorageError: the store failed (the plugin's error is the cause).
    """
    loader = LeafLoader(weights_only=True)  # objects are read as their stored bytes, never unpickled here
    tensors: list[tuple[Any, torch.Tensor, Callable[[], Any]]] = []
    blobs: list[tuple[Any, Callable[[], bytes]]] = []
    for item in plan.items:
        logical, entry = _entry(view, item.storage_index.fqn, path)
        if item.type == LoadItemType.BYTE_IO:
            if isinstance(entry, ObjectEntry):
                blobs.append((item, loader.add_stored_bytes(logical, entry.piece)))
            elif isinstance(entry, PrimitiveEntry):
                blobs.append((item, functools.partial(serialize_object, entry.value)))
            else:
                raise UnsupportedValueError(
                    f"DCP asked for {logical!r} as bytes, but the snapshot holds a tensor there"
                )
            continue
        if not isinstance(entry, (TensorEntry, ShardedTensorEntry)):
            raise UnsupportedValueError(f"DCP asked for {logical!r} as a tensor, but the snapshot holds a {entry.kind}")
        target = planner.resolve_tensor(item).detach()
        region = Box(tuple(item.storage_offsets), tuple(item.lengths))
        destination: Any = target
        if region.sizes != entry.shape:  # a part of the stored tensor: filled as a chunk of it
            destination = LocalChunks(dtype_from_name(entry.dtype), entry.shape, ((region, target),))
        tensors.append((item, target, loader.add(logical, entry, destination)))
    fetch_planned(open_plugin, path, loader, config)
    for item, thunk in blobs:
        planner.load_bytes(item, io.BytesIO(thunk()))
    for item, target, value_of in tensors:
        value = value_of()
        if isinstance(value, torch.Tensor) and value is not target:
            target.copy_(value)
        planner.commit_tensor(item, target)
