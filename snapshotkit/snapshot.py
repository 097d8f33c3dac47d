"""The facade: :class:`Snapshot`. It orchestrates; the modules it calls do the work."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from snapshotkit._config import Config, snapshot_path
from snapshotkit._dist import resolve_group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import Entry, escape_key
from snapshotkit._pending import PendingTake
from snapshotkit._restore import engine as restore_engine
from snapshotkit._restore.bases import intact_bases, open_snapshot_storage
from snapshotkit._restore.metadata import load_metadata
from snapshotkit._restore.partial import RestoreReport
from snapshotkit._runtime.progress import check_progress
from snapshotkit._take import engine as take_engine
from snapshotkit._take import warm as take_warm
from snapshotkit._take.collect import TensorPrepareFunc
from snapshotkit._take.prepare import LoadBase
from snapshotkit.errors import InvalidArgumentError
from snapshotkit.stateful import AppState
from snapshotkit.storage import StoragePlugin

__all__ = ["PendingSnapshot", "Snapshot"]

T = TypeVar("T")


class Snapshot:
    """A committed snapshot at a path (local directory or storage URI).

    ``Snapshot(path)`` is cheap: the manifest is read on first use. Use :meth:`take` to create
    one; :meth:`restore` and :meth:`read_object` to get state back.

    The constructor and the methods take torchsnapshot's arguments in torchsnapshot's order,
    positionally too; snapshotkit's own options follow them, keyword-only.

    Args:
        path: where the snapshot lives: ``/local/dir``, ``file:///dir``, ``memory://name``, or
            any scheme a registered storage plugin serves (a ``str`` or ``os.PathLike``; a local
            path starting with ``~`` is expanded).
        pg: the ``torch.distributed`` process group (default: the default group, or world size 1
            when torch.distributed is not initialized).
        storage_options: passed to the storage plugin (credentials, endpoints...).
    """

    def __init__(self, path: str, pg: Any | None = None, storage_options: dict[str, Any] | None = None) -> None:
        self.path = snapshot_path(path)
        self.pg = pg
        self._storage_options = dict(storage_options or {})
        self._metadata: SnapshotMetadata | None = None

    def __repr__(self) -> str:
        return f"Snapshot({self.path!r})"

    def _committed(self, metadata: SnapshotMetadata | None) -> Snapshot:
        """This snapshot, told the manifest its take just committed (None on ranks other than 0:
        read on first use)."""
        if metadata is not None and self._metadata is None:
            self._metadata = metadata
        return self

    @classmethod
    def take(
        cls,
        path: str,
        app_state: AppState,
        pg: Any | None = None,
        replicated: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        _custom_tensor_prepare_func: TensorPrepareFunc | None = None,
        *,
        memory_budget_bytes: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        base: str | os.PathLike[str] | Snapshot | None = None,
        progress: bool = False,
        _replace: bool = False,
    ) -> Snapshot:
        """Snapshot the state of every object in ``app_state`` to ``path``.

        Calls each object's ``state_dict()`` (an :class:`~snapshotkit.RNGState` first), writes the
        tensors and objects into a few large data objects under a host-memory budget, then
        commits the manifest. Nothing at ``path`` opens as a snapshot until the commit.

        Args:
            path: a location that does not hold a snapshot yet.
            app_state: name -> :class:`~snapshotkit.Stateful` (modules, optimizers, schedulers,
                :class:`~snapshotkit.StateDict`, ...).
            pg: the process group (see the class docstring).
            replicated: glob patterns over logical paths (``"optim/**"``) of state that is the
                same on every rank. A pattern counts if every rank passes it; matching leaves
                that every rank holds alike are written once, spread over the ranks. State of
                ``DistributedDataParallel`` modules is inferred replicated.
            storage_options: passed to the storage plugin.
            _custom_tensor_prepare_func: torchsnapshot's hook to change what is stored for a
                tensor, ``func(logical_path, tensor, tracing) -> tensor`` (e.g. a cast to
                ``bfloat16`` for storage). For every tensor leaf (every local shard of a
                sharded tensor) it is called with ``tracing=True``, where only the dtype and
                shape of the result matter, then with ``tracing=False``: that result is stored,
                under the tensor's logical path, in its dtype. It may change the dtype, not the
                shape. It runs on the calling thread before anything is written (also for
                :meth:`async_take`), and the results are held until they are staged.
            memory_budget_bytes: host bytes the pipeline may hold at once (default:
                ``SNAPSHOTKIT_MEMORY_BUDGET_BYTES``, else 60% of available RAM, at most 32 GiB;
                one staging budget per process, shared with :meth:`async_take` calls in flight).
            metadata: your own JSON object, stored in the manifest and returned by
                ``Snapshot(path).metadata.user_metadata`` (e.g. ``{"step": 1000, "loss": 0.25}``):
                ``str`` keys; values dicts, lists, ``str``, ``int``, finite ``float``, ``bool``
                or ``None``; at most 1 MiB as JSON, nested at most 100 levels. It is read back as
                a JSON round trip gives it (mappings as ``dict``). With several ranks, rank 0's
                is stored (every rank's is checked).
            include: glob patterns over logical paths, matched like ``replicated`` (``*`` also
                matches ``/``): store only the leaves that match one (default: every leaf). An
                empty container counts as a leaf.
            exclude: glob patterns of leaves not to store, even if ``include`` matches them.
                Containers are kept as far as they hold stored leaves: a dict keeps only those
                keys; a list or tuple is stored whole or not at all (it is dropped if any leaf
                below it is not stored, since restore could not rebuild it with a hole); an
                ``app_state`` key with nothing left is not in the snapshot at all. Each rank
                applies its own patterns to its own state. Restore such a snapshot with
                ``strict=False`` to keep the current values of what it lacks.
            base: an earlier snapshot (a path, or a :class:`Snapshot`) to take *incrementally*
                against: every piece of at least ``SNAPSHOTKIT_MIN_REFERENCE_BYTES`` (64 KiB)
                whose bytes equal a piece of the base (same 128-bit content hash and CRC-32C) is
                recorded as a reference to the base instead of being written. The base must lie in
                the folder that holds ``path`` (or below it), on the same store, and must stay
                there as long as this snapshot is read (``snapshotkit consolidate`` makes a
                self-contained copy). Restore, ``read_object``, verify, diff and export read an
                incremental snapshot exactly like a full one.
            progress: show a bar on stderr (bytes written of the total, rate) once the take has
                run 2 s; it stays, in its final state, when the take ends.
            _replace: internal (``SnapshotCheckpointIO``): replace a snapshot at ``path`` atomically (docs/api.md).

        Returns:
            The committed snapshot.

        Raises:
            SnapshotExistsError: ``path`` holds a snapshot, or ``step_<n>`` ones below it (``FolderOfSnapshotsError``).
            InvalidArgumentError: ``path`` is not a ``str`` or ``os.PathLike``; ``metadata`` is not
                a mapping; ``include`` or ``exclude`` is not a list of ``str`` patterns;
                ``_custom_tensor_prepare_func`` is not callable.
            SnapshotNotFoundError: ``base`` is not a committed snapshot.
            ConfigError: ``base`` lies outside the folder that holds ``path``; ``path`` is empty
                (or an argument is out of range); ``metadata`` holds a
                key that is not a ``str``, a value that is not JSON (NaN and infinity included), or
                is too large or deep (the message names the key path); ``include``/``exclude``
                select nothing of a non-empty state.
            InvalidAppStateError: an ``app_state`` value is not Stateful.
            UnsupportedValueError: a leaf cannot be stored (unpicklable, meta tensor), or
                containers nest deeper than 1,000 levels; ``_custom_tensor_prepare_func``
                returned something other than a tensor of the leaf's shape (or another dtype
                with ``tracing=False`` than with ``tracing=True``).
            StorageError: the store failed (the plugin's error is the cause).
            RankFailedError: another rank failed (its error is the cause); nothing was committed.
            CollectiveTimeoutError: other ranks did not reach a step of the take in time.
        """
        show = check_progress(progress, "Snapshot.take")
        where = snapshot_path(path)
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
        group = resolve_group(pg, timeout_seconds=config.collective_timeout_seconds)
        options = dict(storage_options or {})
        target, committed = take_engine.take(
            where,
            app_state,
            group=group,
            config=config,
            replicated=list(replicated or ()),
            storage_options=options,
            user_metadata=metadata,
            include=include,
            exclude=exclude,
            tensor_prepare_func=_custom_tensor_prepare_func,
            load_base=_base_loader(base, pg, options),
            progress=show,
            replace=_replace is True,
        )
        return cls(target, pg=pg, storage_options=options)._committed(committed)

    @classmethod
    def async_take(
        cls,
        path: str,
        app_state: AppState,
        pg: Any | None = None,
        replicated: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        _custom_tensor_prepare_func: TensorPrepareFunc | None = None,
        *,
        memory_budget_bytes: int | None = None,
        executor: str = "thread",
        metadata: Mapping[str, Any] | None = None,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        base: str | os.PathLike[str] | Snapshot | None = None,
        progress: bool = False,
        _replace: bool = False,
    ) -> PendingSnapshot:
        """Stage ``app_state`` and return; write and commit in the background.

        Returns once everything the caller could change has been copied: ``state_dict()`` was
        called, objects serialized, and every tensor piece copied into staging buffers (GPU
        tensors through pinned buffers on a side stream per device, after the kernels already
        queued on the caller's current stream). From then on, nothing the caller does
        to its modules, optimizers or tensors changes the snapshot. Staging holds at most
        ``memory_budget_bytes`` at once in the process, every take in flight together, buffers
        counted at their real size (powers of two, at least 1 MiB; pooled free ones included):
        beyond it, ``async_take`` waits for background writes to drain. Another ``async_take``
        while one is pending queues behind it, staging as its writes give memory back (its
        writes go after the earlier ones; snapshots to different paths never mix).

        Args:
            executor: ``"thread"`` writes on snapshotkit's background I/O thread;
                ``"process"`` hands staged objects, through shared memory, to a checkpoint
                daemon process started on first use and reused, so checksumming and storage
                calls never compete with training for the GIL. A process-local store
                (``memory://``) raises ``ConfigError`` before anything is read: use ``"thread"``.
            progress: as for :meth:`take`, for the background writes.

        The other arguments are as for :meth:`take`.

        Returns:
            A :class:`PendingSnapshot`: ``wait()`` returns the committed :class:`Snapshot` or
            raises what went wrong; ``done()`` polls.
        """
        show = check_progress(progress, "Snapshot.async_take")
        where = snapshot_path(path)
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
        group = resolve_group(pg, timeout_seconds=config.collective_timeout_seconds)
        options = dict(storage_options or {})
        job = take_engine.async_take(
            where,
            app_state,
            group=group,
            config=config,
            replicated=list(replicated or ()),
            storage_options=options,
            executor=executor,
            user_metadata=metadata,
            include=include,
            exclude=exclude,
            tensor_prepare_func=_custom_tensor_prepare_func,
            load_base=_base_loader(base, pg, options),
            progress=show,
            replace=_replace is True,
        )
        return PendingSnapshot(job, pg, cls(job.path, pg=pg, storage_options=options)._committed)

    @classmethod
    def prepare_async(
        cls,
        app_state: AppState,
        pg: Any | None = None,
        replicated: Sequence[str] | None = None,
        _custom_tensor_prepare_func: TensorPrepareFunc | None = None,
        *,
        memory_budget_bytes: int | None = None,
        executor: str = "thread",
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
    ) -> int:
        """Warm up :meth:`async_take`: allocate its staging buffers now, so its first call costs what later ones do.

        Plans the take of ``app_state`` as :meth:`async_take` would with the same arguments (calls
        ``state_dict()``; collective: call it on every rank), then allocates the staging buffers
        that take holds at once, up to ``memory_budget_bytes`` (rounded up to powers of two;
        pinned when the state has GPU tensors; shared memory and the checkpoint daemon for ``"process"``),
        and writes every page so the first copy pays no page faults. Nothing is written to
        storage. Idempotent; the next :meth:`async_take` with this ``executor`` uses the buffers,
        which stay pooled for later takes. Arguments and errors (raised before anything is
        allocated): as for :meth:`async_take`. Returns the bytes of buffers this call allocated.
        """
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
        group = resolve_group(pg, timeout_seconds=config.collective_timeout_seconds)
        kwargs: dict[str, Any] = {"include": include, "exclude": exclude, "executor": executor}
        kwargs.update(group=group, config=config, replicated=list(replicated or ()))
        kwargs["tensor_prepare_func"] = _custom_tensor_prepare_func
        return take_warm.prepare_async(app_state, **kwargs)

    def _plugin(self) -> StoragePlugin:
        """The snapshot's storage; once the manifest is read, also its bases' (an incremental
        snapshot's references)."""
        bases = self._metadata.bases if self._metadata is not None else {}
        return open_snapshot_storage(self.path, self._storage_options, bases)

    @property
    def metadata(self) -> SnapshotMetadata:
        """The decoded manifest (read once, then cached).

        Raises:
            SnapshotNotFoundError: nothing is at the path, or something that is not a snapshot.
            IncompleteSnapshotError: data objects of a take are there but the take never committed.
            ForeignCheckpointError: another library's checkpoint (torchsnapshot, DCP, safetensors,
                ``torch.save``) is there; the message gives the ``snapshotkit import`` command that
                converts it.
            ManifestError: the manifest is malformed or from a newer format version.
            StorageError: the store failed (the plugin's error is the cause).
        """
        return self._metadata_for(())

    def _metadata_for(self, wanted: Sequence[str]) -> SnapshotMetadata:
        """The metadata; errors reading it name the ``wanted`` logical paths."""
        if self._metadata is None:
            self._metadata = load_metadata(self._plugin, self.path, wanted)
        return self._metadata

    def get_manifest(self) -> dict[str, Entry]:
        """A copy of the manifest: ``"<rank>/<logical path>"`` -> entry."""
        return copy.deepcopy(dict(self.metadata.manifest))

    def restore(
        self,
        app_state: AppState,
        strict: bool = True,
        *,
        memory_budget_bytes: int | None = None,
        weights_only: bool = True,
        verify_checksums: bool | None = None,
        progress: bool = False,
    ) -> RestoreReport:
        """Load the snapshot into the objects of ``app_state``, in place where possible.

        Tensors whose dtype and shape match the object's current ``state_dict()`` are filled in
        place (tied weights stay tied); the rest are loaded fresh and handed to
        ``load_state_dict()``. An :class:`~snapshotkit.RNGState` is loaded last, whole, as saved.

        Keys (logical paths of leaves) the snapshot and an object's current ``state_dict()`` do
        not share are reported in the returned :class:`~snapshotkit.RestoreReport`, like
        ``nn.Module.load_state_dict``: ``missing_keys`` the object has and the snapshot lacks
        (say, of a snapshot taken with ``include=``), ``unexpected_keys`` the snapshot has and the
        object lacks. Objects are compared through the dicts both sides hold; a list or tuple,
        and a dict that is empty in the object (a fresh optimizer's ``state``, an empty
        :class:`~snapshotkit.StateDict`), take the saved value whole and report nothing below.

        Args:
            app_state: keys of the snapshot to restore, name -> object.
            strict: with ``True`` (the default): an app_state key the snapshot lacks, a tensor whose shape or
                dtype differs from its destination (an optimizer's state tensor: from its parameter), a module
                whose keys differ, or another object whose ``state_dict()`` has keys the snapshot lacks, raise
                (nothing is loaded). With ``False``: an absent key is skipped (all its leaves reported missing);
                mismatched tensors load fresh (optimizer state: left out, in ``mismatched_keys``); modules load with
                ``load_state_dict(strict=False)``; any other object gets the saved leaves merged
                over its current ``state_dict()``, so keys the snapshot lacks keep their current
                values, and the merged state is passed to its ``load_state_dict()``.
            memory_budget_bytes: host bytes for bounce buffers at once (see :meth:`take`).
            weights_only: load pickled objects with ``torch.load(weights_only=True)``; pass
                ``False`` only for snapshots you trust.
            verify_checksums: check every piece's CRC-32C (default on, or
                ``SNAPSHOTKIT_VERIFY_CHECKSUMS``).
            progress: show a bar of the bytes read (see :meth:`take`).

        Returns:
            This rank's :class:`~snapshotkit.RestoreReport` (with several ranks, each rank gets
            its own).

        Raises:
            InvalidAppStateError: ``app_state`` is not a dict of Stateful objects (checked first,
                before the snapshot is opened).
            AppStateKeyNotFoundError: (strict) an app_state key is not in the snapshot (a
                ``LogicalPathNotFoundError``, also an ``AssertionError`` as in torchsnapshot).
            StateMismatchError: (strict) a tensor, module or object does not match (the message
                lists up to ten keys of each side); whatever ``strict`` says, a destination on the meta
                device, a module tensor of another shape, or optimizer parameter groups of other sizes.
            IntegrityError: stored bytes are corrupt or truncated.
            StorageError: the store failed (the plugin's error is the cause).
        """
        show = check_progress(progress, "Snapshot.restore")
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=verify_checksums)
        group = resolve_group(self.pg, timeout_seconds=config.collective_timeout_seconds)
        wanted = sorted(str(key) for key in app_state) if isinstance(app_state, Mapping) else []
        return restore_engine.restore(
            lambda: self._metadata_for(wanted),  # read once app_state passed its check
            app_state,
            path=self.path,
            open_plugin=self._plugin,
            group=group,
            config=config,
            strict=strict,
            weights_only=weights_only,
            progress=show,
        )

    def read_object(
        self,
        path: str,
        obj_out: T | None = None,
        memory_budget_bytes: int | None = None,
        *,
        weights_only: bool = True,
        verify_checksums: bool | None = None,
    ) -> T:
        """Read one value by logical path, without loading anything else.

        Args:
            path: a logical path such as ``"model/layer1.weight"`` (torchsnapshot's rank-prefixed
                ``"0/model/layer1.weight"`` works too). A container path (``"model"``) returns
                the whole subtree.
            obj_out: a tensor of the stored dtype and shape to load into in place; it is returned.
                Anything else that is not None is ignored with a WARNING on logger
                ``snapshotkit.restore`` (as torchsnapshot does), and the stored value returned.
            memory_budget_bytes: host bytes for bounce buffers at once; large tensors are read
                in byte ranges of at most this size when they cannot land in place directly.
            weights_only: see :meth:`restore`.
            verify_checksums: see :meth:`restore`.

        Raises:
            LogicalPathNotFoundError: no such logical path (the message lists close matches).
            InvalidArgumentError: ``path`` is not a ``str``.
            StateMismatchError: ``obj_out`` is a tensor of another dtype or shape, on the meta
                device, or the value at ``path`` is not a tensor.
            StorageError: the store failed (the plugin's error is the cause).
        """
        group = resolve_group(self.pg)
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=verify_checksums)
        result: T = restore_engine.read_object(
            self._metadata_for([path] if isinstance(path, str) else []),
            path,
            obj_out,
            path=self.path,
            open_plugin=self._plugin,
            rank=group.rank,
            config=config,
            weights_only=weights_only,
        )
        return result

    def get_state_dict_for_key(
        self,
        key: str,
        *,
        memory_budget_bytes: int | None = None,
        weights_only: bool = True,
        verify_checksums: bool | None = None,
    ) -> Any:
        """The state dict saved for one ``app_state`` key, without loading it into anything.

        It is what :meth:`restore` would hand to that object's ``load_state_dict()`` (containers
        rebuilt, tensors on the CPU), and only that key's bytes are read.

        Args:
            key: an ``app_state`` key as passed to :meth:`take` (``"model"``; not escaped).
            memory_budget_bytes: see :meth:`read_object`.
            weights_only: see :meth:`restore`.
            verify_checksums: see :meth:`restore`.

        Returns:
            The saved state dict (a ``dict`` or ``OrderedDict`` for modules, optimizers and
            :class:`~snapshotkit.StateDict`; whatever ``state_dict()`` returned otherwise).

        Raises:
            InvalidArgumentError: ``key`` is not a ``str``.
            AppStateKeyNotFoundError: the snapshot has no such key for this rank (the message
                lists close matches); a ``KeyError``, and an ``AssertionError`` as torchsnapshot
                raises.
            IntegrityError: stored bytes are corrupt or truncated.
            StorageError: the store failed (the plugin's error is the cause).
        """
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"get_state_dict_for_key takes an app_state key as a str (e.g. 'model'), got "
                f"{type(key).__name__} {key!r}"
            )
        group = resolve_group(self.pg)
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=verify_checksums)
        return restore_engine.read_state_dict(
            self._metadata_for([escape_key(key)]),
            key,
            path=self.path,
            open_plugin=self._plugin,
            rank=group.rank,
            config=config,
            weights_only=weights_only,
        )


class PendingSnapshot(PendingTake[Snapshot]):
    """A snapshot being written in the background; :meth:`wait` gives the committed :class:`Snapshot`.

    Attributes:
        path: where the snapshot is being written (rank 0's path).
        pg: the process group of the take.
    """

    def wait(self, timeout: float | None = None) -> Snapshot:
        """Block until the snapshot is committed and return it; raise what went wrong.

        Raises:
            WaitTimeoutError: ``timeout`` seconds passed first; the snapshot keeps being
                written and ``wait`` may be called again.
            RankFailedError: another rank's writes failed (its error is the cause).
            CheckpointDaemonError: the checkpoint daemon died.
            StorageError, ...: this rank's own failure, as ``take`` would raise it.
        """
        return super().wait(timeout)


def _base_loader(base: object, pg: Any | None, storage_options: dict[str, Any]) -> LoadBase | None:
    """How a take reads ``base=`` (in the take, so an unreadable base fails every rank before any write), or None.

    Raises:
        InvalidArgumentError: ``base`` is not a path, a :class:`Snapshot` or None.
    """
    if base is None:
        return None
    if not isinstance(base, (Snapshot, str, os.PathLike)):
        raise InvalidArgumentError(
            f"base must be the path of an earlier snapshot or a Snapshot, got {type(base).__name__} {base!r}"
        )
    snapshot = base if isinstance(base, Snapshot) else Snapshot(os.fspath(base), pg=pg, storage_options=storage_options)

    def load() -> tuple[str, SnapshotMetadata, frozenset[str]]:
        metadata = snapshot.metadata
        return snapshot.path, metadata, intact_bases(snapshot.path, metadata.bases, storage_options)

    return load
