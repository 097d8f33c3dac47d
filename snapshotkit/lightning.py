"""Lightning checkpoints as snapshotkit snapshots: :class:`SnapshotCheckpointIO`.

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from snapshotkit.lightning import SnapshotCheckpointIO

    trainer = Trainer(plugins=[SnapshotCheckpointIO(async_save=True)],
                      callbacks=[ModelCheckpoint(dirpath="ckpt", save_top_k=2, save_last=True)])
    trainer.fit(model, ckpt_path="ckpt/last.ckpt")      # resumes from the snapshot

The same class serves ``lightning.pytorch`` and ``pytorch_lightning``: importing this module
registers it as a (virtual) subclass of the ``CheckpointIO`` of each one installed, which is what
either ``Trainer`` checks its plugins against. Importing it needs one of them (``pip install
"snapshotkit[integrations]"``); ``import snapshotkit`` never imports Lightning. See ``docs/lightning.md``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Mapping
from typing import Any

from snapshotkit._config import snapshot_path
from snapshotkit._dist import own_process_group
from snapshotkit._lifecycle.removal import remove_snapshot
from snapshotkit._lightning.checkpoint import (
    MapLocation,
    check_map_location,
    checkpoint_app_state,
    load_checkpoint_dict,
)
from snapshotkit.errors import ConfigError, InvalidArgumentError
from snapshotkit.snapshot import PendingSnapshot, Snapshot

__all__ = ["SnapshotCheckpointIO"]

#: The ``CheckpointIO`` base class of each Lightning distribution: (distribution, module).
_BASES = (
    ("lightning", "lightning.fabric.plugins.io.checkpoint_io"),
    ("lightning_fabric", "lightning_fabric.plugins.io.checkpoint_io"),
)
_EXECUTORS = ("thread", "process")


class SnapshotCheckpointIO:
    """A Lightning ``CheckpointIO`` that writes each checkpoint as a snapshot at the path Lightning gives.

    ``Trainer(plugins=[SnapshotCheckpointIO()])`` makes every ``trainer.save_checkpoint`` (and so
    every ``ModelCheckpoint`` save) a :meth:`Snapshot.take` of the checkpoint dict to that path (a
    directory, or any URI snapshotkit stores to), every ``ckpt_path=`` load a read of it, and
    every removal of an old top-k checkpoint a crash-safe deletion (manifest first). Saving onto
    a path that holds a snapshot (``last.ckpt``, saved again and again) replaces it atomically:
    the path opens as the old checkpoint until the new one is committed, and a save that fails
    or is killed midway leaves the old one.

    Only the process that saves takes part: under ``torch.distributed`` (DDP) the global rank 0
    saves alone, through a process group of its own, as Lightning's strategies call it.

    Args:
        async_save: save with :meth:`Snapshot.async_take`: ``save_checkpoint`` returns once the
            checkpoint is staged (tensors copied into staging buffers) and the writes and the
            commit go on in the background. A save queues behind pending ones (their staging
            memory bounds how far) and waits for a pending save to the same path; removing or
            loading a path waits for its pending save; a failed background save raises its error
            from the next ``save_checkpoint``, ``remove_checkpoint``, ``load_checkpoint`` or
            ``teardown`` (which the ``Trainer`` calls at the end of ``fit``, after waiting for
            every pending save).
        executor: ``async_take``'s executor, ``"thread"`` or ``"process"``.
        storage_options: for the storage plugin (``s3://`` credentials, endpoint...);
            ``trainer.save_checkpoint(..., storage_options=...)`` adds to them for one save.
        memory_budget_bytes: host memory for staging and reads (snapshotkit's default when None).

    Raises:
        InvalidArgumentError: an argument of the wrong type.
        ConfigError: an unknown ``executor`` or a budget that is not a positive int.
    """

    def __init__(
        self,
        *,
        async_save: bool = False,
        executor: str = "thread",
        storage_options: Mapping[str, Any] | None = None,
        memory_budget_bytes: int | None = None,
    ) -> None:
        if not isinstance(async_save, bool):
            raise InvalidArgumentError(f"async_save must be True or False, got {async_save!r}")
        if executor not in _EXECUTORS:
            raise ConfigError(f"executor must be 'thread' or 'process', got {executor!r}")
        if memory_budget_bytes is not None and (
            type(memory_budget_bytes) is not int or memory_budget_bytes <= 0  # bool is not a budget
        ):
            raise ConfigError(f"memory_budget_bytes must be a positive int or None, got {memory_budget_bytes!r}")
        self.async_save = async_save
        self.executor = executor
        self.storage_options = _options(storage_options, "storage_options")
        self.memory_budget_bytes = memory_budget_bytes
        self._lock = threading.Lock()
        self._pending: list[PendingSnapshot] = []
        self._group: Any = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(async_save={self.async_save}, executor={self.executor!r})"

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` as a snapshot at ``path``.

        Each top-level key is an app-state key: the logical paths are ``state_dict/<param>``,
        ``optimizer_states/0/state/0/exp_avg``, ``loops/fit_loop/...``, ``epoch``, ...

        Args:
            checkpoint: the dict Lightning built.
            path: where (a directory path or a URI; ``os.PathLike`` too).
            storage_options: added to the constructor's for this save.

        Raises:
            InvalidArgumentError: ``checkpoint`` is not a dict with ``str`` keys, or
                ``storage_options`` not a dict; before anything is written.
            StorageError, UnsupportedValueError, ...: what :meth:`Snapshot.take` raises (with
                ``async_save``, a background failure is raised later, see the class). On any
                failure ``path`` opens as what it held before (the previous checkpoint there,
                or nothing).
        """
        where = snapshot_path(path)
        options = {**self.storage_options, **_options(storage_options, "storage_options")}
        app_state, metadata = checkpoint_app_state(checkpoint)
        self._settle(where)
        if not self.async_save:
            Snapshot.take(
                where,
                app_state,
                pg=self._own_group(),
                storage_options=options,
                memory_budget_bytes=self.memory_budget_bytes,
                metadata=metadata,
                _replace=True,
            )
            return
        pending = Snapshot.async_take(
            where,
            app_state,
            pg=self._own_group(),
            storage_options=options,
            memory_budget_bytes=self.memory_budget_bytes,
            executor=self.executor,
            metadata=metadata,
            _replace=True,
        )
        with self._lock:
            self._pending.append(pending)

    def load_checkpoint(
        self, path: Any, map_location: MapLocation = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint dict the snapshot at ``path`` holds, every checksum verified.

        Args:
            path: the snapshot (waits for a pending save to it first).
            map_location: as for ``torch.load``: a device (or its name) for every tensor, a dict
                from the location a tensor was saved from (``"cuda:1"``) to where it goes, or a
                function of ``(storage, location)``. None (Lightning's call) loads every tensor
                on the CPU, as Lightning's ``TorchCheckpointIO`` does.
            weights_only: None or True loads pickled objects (such as ``hyper_parameters``
                holding class instances) only if ``torch.load(weights_only=True)`` would;
                False for a checkpoint you trust that needs more.

        Raises:
            SnapshotNotFoundError: nothing committed at ``path``.
            IntegrityError: the snapshot's bytes are damaged (the message names the logical
                path; run ``snapshotkit verify``).
            UnsafeObjectError: an object ``weights_only`` refuses.
            StorageError: the store failed.
            InvalidArgumentError: a ``map_location`` ``torch.load`` would not take.
        """
        where = snapshot_path(path)
        check_map_location(map_location)
        if weights_only is not None and not isinstance(weights_only, bool):
            raise InvalidArgumentError(f"weights_only must be None, True or False, got {weights_only!r}")
        self._settle(where)
        snapshot = Snapshot(where, pg=self._own_group(), storage_options=self.storage_options)
        return load_checkpoint_dict(
            snapshot,
            map_location=map_location,
            weights_only=weights_only is not False,
            memory_budget_bytes=self.memory_budget_bytes,
        )

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the snapshot at ``path``: its manifest first, so a removal cut short leaves
        nothing that opens; files a take does not write stay. Waits for a pending save to
        ``path`` first. Nothing at ``path`` is not an error.

        Raises:
            StorageError: the store failed.
        """
        where = snapshot_path(path)
        self._settle(where)
        remove_snapshot(where, self.storage_options)

    def teardown(self) -> None:
        """Wait for every pending save; raise the first failure among them."""
        self._settle(None)

    def _settle(self, path: str | None) -> None:
        """Wait for the pending saves up to the last one to ``path`` (all of them for None), and
        raise the first failure among them or among those already finished."""
        with self._lock:
            pending = list(self._pending)
        key = _path_key(path) if path is not None else None
        last = max((i for i, p in enumerate(pending) if key is None or _path_key(p.path) == key), default=-1)
        first_error: BaseException | None = None
        for index, save in enumerate(pending):
            if index > last and not save.done():
                continue
            error: BaseException | None = None
            try:
                save.wait()
            except BaseException as exc:  # raised below, after the others settled
                error = exc
            with self._lock:
                if save not in self._pending:
                    continue  # settled by another thread, which raises its error
                self._pending.remove(save)
            first_error = first_error or error
        if first_error is not None:
            raise first_error

    def _own_group(self) -> Any:
        """A process group of this process alone when ``torch.distributed`` runs several (the
        saving rank calls without the others), else None; made once."""
        if self._group is None:
            self._group = own_process_group()
        return self._group


def _path_key(path: str) -> str:
    """``path`` compared as the same snapshot however it is spelled (a local path relative, absolute
    or through a symlink, as Lightning's ``ModelCheckpoint`` resolves its ``dirpath``)."""
    return path if "://" in path else os.path.realpath(path)


def _options(value: object, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a dict of storage options or None, got {type(value).__name__}")
    return dict(value)


def _register() -> None:
    """Make :class:`SnapshotCheckpointIO` a ``CheckpointIO`` of every Lightning installed."""
    found = False
    for distribution, module in _BASES:
        if importlib.util.find_spec(distribution) is None:
            continue
        importlib.import_module(module).CheckpointIO.register(SnapshotCheckpointIO)
        found = True
    if not found:
        raise ImportError(
            "snapshotkit.lightning needs Lightning: pip install lightning (or pytorch-lightning), or "
            'pip install "snapshotkit[integrations]"'
        )


_register()
