"""``torch.distributed.checkpoint`` (DCP) storage that writes and reads snapshotkit snapshots.

Example::

    import torch.distributed.checkpoint as dcp
    from snapshotkit.dcp import SnapshotReader, SnapshotWriter

    dcp.save(state_dict, storage_writer=SnapshotWriter("s3://bucket/run/step_100"))
    dcp.load(state_dict, storage_reader=SnapshotReader("s3://bucket/run/step_100"))

What a save writes is a snapshot like any other: ``Snapshot(path)`` opens it, ``snapshotkit
verify``/``info``/``ls`` work on it, every byte is checksummed, and its manifest is written last.
Each DCP key gets the logical path ``Snapshot.take`` would give it (``model.layer1.weight`` of
``{"model": model.state_dict()}`` -> ``model/layer1.weight``). See ``docs/dcp.md``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from snapshotkit._config import Config, snapshot_path
from snapshotkit._dcp.read import DcpView, dcp_view, read_items
from snapshotkit._dcp.write import save_part
from snapshotkit._dist import resolve_group
from snapshotkit._take.detached import WrittenPart, commit_parts
from snapshotkit.errors import InvalidArgumentError
from snapshotkit.snapshot import Snapshot
from snapshotkit.storage._registry import serves

__all__ = ["SnapshotReader", "SnapshotWriter"]


def _valid_id(checkpoint_id: object) -> bool:
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        return False
    try:
        text = snapshot_path(checkpoint_id)
    except Exception:
        return False
    return serves(text)


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def _item_bytes(item: Any) -> int:
    if item.tensor_data is None:
        return 0
    numel = 1
    for size in item.tensor_data.chunk.sizes:
        numel *= size
    return int(numel * item.tensor_data.properties.dtype.itemsize)


def _holds_cuda(value: Any) -> bool:
    """Whether a (nested) state dict holds a CUDA tensor (a DTensor's local tensor included)."""
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return bool(local.is_cuda)
    if isinstance(value, Mapping):
        return any(_holds_cuda(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_cuda(v) for v in value)
    return False


class SnapshotWriter(StorageWriter, BlockingAsyncStager):
    """A DCP ``StorageWriter`` that writes a snapshot at ``path``.

    Each rank writes the items DCP's planner gave it through snapshotkit's take pipeline
    (staged under the memory budget, checksummed, any storage scheme); DCP's coordinator rank
    then commits the manifest, last. Picklable, so ``dcp.async_save`` works with both
    executors (thread and process).

    Like DCP's ``FileSystemWriter`` it is the stager of ``dcp.async_save`` (a
    ``BlockingAsyncStager``): the call copies the state to the CPU before it returns, into new
    tensors each time, or, with ``cache_staged_state_dict=True``, into the same (pinned where
    CUDA is available) tensors every call, which blocks the caller about as long as a memcpy of
    the state and keeps one copy of it in memory between saves.

    Args:
        path: where the snapshot goes (a directory, ``file://``, ``s3://``, ``gs://``... any
            scheme a storage plugin serves); it must not hold a snapshot yet. A ``checkpoint_id``
            passed to ``dcp.save`` replaces it.
        storage_options: passed to the storage plugin (credentials, endpoints...).
        base: an earlier snapshot (a path or a :class:`~snapshotkit.Snapshot`) in the folder
            that holds ``path``: pieces whose bytes equal the base's are recorded as references
            instead of written (an incremental save, as ``Snapshot.take(base=...)``).
        memory_budget_bytes: host bytes each rank's writing may hold at once (see
            ``Snapshot.take``).
        metadata: your JSON object, stored in the manifest (``Snapshot(path).metadata.user_metadata``).
        cache_staged_state_dict: ``dcp.async_save`` stages into the tensors of the previous call
            (as DCP's ``FileSystemWriter``'s option of that name); reuse one writer for every
            save (``dcp.async_save(..., checkpoint_id=path)`` gives each its path).

    Attributes:
        committed: after a save whose commit ran in this process (the coordinator's writer), the
            committed :class:`~snapshotkit.Snapshot`; else None.
        written_bytes: the bytes this rank's part of the last save wrote (references to ``base``
            excluded).

    Raises:
        InvalidArgumentError: ``path`` or ``base`` is not a path, ``storage_options`` or
            ``metadata`` not a mapping.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        base: str | os.PathLike[str] | Snapshot | None = None,
        memory_budget_bytes: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        cache_staged_state_dict: bool = False,
    ) -> None:
        StorageWriter.__init__(self)
        if not isinstance(cache_staged_state_dict, bool):
            raise InvalidArgumentError(
                f"cache_staged_state_dict must be True or False, got {cache_staged_state_dict!r}"
            )
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        self.path = snapshot_path(path)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidArgumentError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidArgumentError(f"metadata must be a JSON object (a mapping), got {type(metadata).__name__}")
        if isinstance(base, Snapshot):
            base = base.path
        self.base = snapshot_path(base) if base is not None else None
        self.storage_options = dict(storage_options or {})
        self.memory_budget_bytes = memory_budget_bytes
        self.metadata = dict(metadata or {})
        self.is_coordinator = True
        #: The snapshot the last save on this rank's coordinator committed (None elsewhere).
        self.committed: Snapshot | None = None
        #: Bytes this rank wrote in its last save (an incremental save's references excluded).
        self.written_bytes = 0

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``dcp.async_save``'s copy of ``state_dict`` on the CPU (see the class), blocking.

        With ``cache_staged_state_dict``, the copy's tensors are made once and filled again on
        every later call; they are pinned only when the state holds CUDA tensors (DCP's own
        stager pins them always, which fails where no GPU is).
        """
        if not self.cache_staged_state_dict:
            return BlockingAsyncStager.stage(self, state_dict)
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        if self.state_dict_cache is None:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=_holds_cuda(state_dict))
        return _copy_state_dict(state_dict, self.state_dict_cache)

    def __getstate__(self) -> dict[str, Any]:
        # The staging cache stays in the process that stages (DCP's process executor pickles the
        # writer: the cached copy of the state would travel with it).
        return {**self.__dict__, "state_dict_cache": None}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save; with ``checkpoint_id``, at that path."""
        if checkpoint_id is not None:
            self.path = snapshot_path(checkpoint_id)
        self.committed, self.written_bytes = None, 0

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` is a path or URI a snapshot can be written to."""
        return _valid_id(checkpoint_id)

    def storage_meta(self) -> StorageMeta | None:
        """The path, for DCP's planner."""
        return StorageMeta(checkpoint_id=self.path)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Note whether this rank commits (DCP's coordinator).

        Raises:
            InvalidArgumentError: ``dcp.save(use_collectives=False)`` on several ranks (each rank
                would commit a manifest of its own part at the one path); nothing is written.
        """
        self.is_coordinator = is_coordinator
        if kwargs.get("use_collectives", True) is False and resolve_group(None).world_size > 1:
            raise InvalidArgumentError(
                f"SnapshotWriter({self.path!r}) commits one manifest for every rank's part, which needs DCP's "
                "collectives, but dcp.save was called with use_collectives=False on several ranks; nothing was "
                "written. Drop use_collectives=False, or give each rank a path of its own "
                "(e.g. f'{path}/rank_{rank}')"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """DCP's plan, unchanged: its planner decides which rank writes what."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's plans, unchanged."""
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items (its part of the snapshot, not committed yet)."""
        config = Config.resolve(memory_budget_bytes=self.memory_budget_bytes)
        load_base = None
        if self.base is not None:
            base = Snapshot(self.base, storage_options=self.storage_options)

            def load_base() -> Any:
                from snapshotkit._restore.bases import intact_bases

                metadata = base.metadata
                return base.path, metadata, intact_bases(base.path, metadata.bases, self.storage_options)

        part = save_part(
            self.path, plan, planner, storage_options=self.storage_options, config=config, load_base=load_base
        )
        self.written_bytes = part.written_bytes if part is not None else 0
        results = [
            WriteResult(index=item.index, size_in_bytes=_item_bytes(item), storage_data=None) for item in plan.items
        ]
        if results:
            results[0] = dataclasses.replace(results[0], storage_data=part)
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: merge every rank's part and write the manifest (the coordinator only)."""
        parts = [r.storage_data for rank in results for r in rank if isinstance(r.storage_data, WrittenPart)]
        committed = commit_parts(self.path, self.storage_options, parts, self.metadata)
        self.committed = Snapshot(self.path, storage_options=self.storage_options)._committed(committed)


class SnapshotReader(StorageReader):
    """A DCP ``StorageReader`` that loads a snapshot at ``path`` (any snapshot, not only one
    :class:`SnapshotWriter` wrote), resharding as DCP's planner asks.

    Every region DCP asks for is read through snapshotkit's restore pipeline: only the stored
    pieces that overlap it, in byte ranges, under the memory budget, each verified against its
    checksum (a damaged piece raises :class:`~snapshotkit.errors.IntegrityError` naming its
    logical path; DCP wraps it in its ``CheckpointException``).

    Args:
        path: the snapshot (a ``checkpoint_id`` passed to ``dcp.load`` replaces it).
        storage_options: passed to the storage plugin.
        memory_budget_bytes: host bytes for bounce buffers at once (see ``Snapshot.restore``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        memory_budget_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.path = snapshot_path(path)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidArgumentError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
        self.storage_options = dict(storage_options or {})
        self.memory_budget_bytes = memory_budget_bytes
        self._snapshot: Snapshot | None = None
        self._view: DcpView | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_snapshot": None, "_view": None}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load; with ``checkpoint_id``, from that path."""
        if checkpoint_id is not None:
            self.path = snapshot_path(checkpoint_id)
        self._snapshot, self._view = None, None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` is a path or URI a snapshot can be read from."""
        return _valid_id(checkpoint_id)

    def _dcp_view(self) -> DcpView:
        if self._view is None:
            self._snapshot = Snapshot(self.path, storage_options=self.storage_options)
            self._view = dcp_view(self._snapshot.metadata, self.path)
        return self._view

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata, built from the manifest (no pickle is read)."""
        return self._dcp_view().metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Open the snapshot (its manifest is read once per reader)."""
        self._dcp_view()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """DCP's plan, unchanged."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """DCP's plans, unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read this rank's items into the planner's destinations (verified)."""
        view = self._dcp_view()
        assert self._snapshot is not None
        config = Config.resolve(memory_budget_bytes=self.memory_budget_bytes)
        read_items(view, plan, planner, path=self.path, open_plugin=self._snapshot._plugin, config=config)
        return _done(None)
