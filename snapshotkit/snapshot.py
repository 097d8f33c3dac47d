"""The facade: :class:`Snapshot`. It orchestrates; the modules it calls do the work."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, TypeVar

from snapshotkit._config import Config
from snapshotkit._dist import resolve_group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry, TensorEntry
from snapshotkit._plan.flatten import inflate
from snapshotkit._restore.fetch import read_pieces
from snapshotkit._restore.load import LeafLoader, describe_mismatch, tensor_matches
from snapshotkit._restore.plan import close_matches, missing_key_hint, plan_restore, rank_view, subtree
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit._take.engine import take_on_group, validate_app_state
from snapshotkit._take.writers import PendingSnapshot
from snapshotkit._take.writers import async_take as async_take_on_group
from snapshotkit.errors import (
    BucketNotFoundError,
    IncompleteSnapshotError,
    LogicalPathNotFoundError,
    ManifestError,
    SnapshotNotFoundError,
)
from snapshotkit.stateful import AppState
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin

__all__ = ["Snapshot"]

T = TypeVar("T")


class Snapshot:
    """A committed snapshot at a path (local directory or storage URI).

    ``Snapshot(path)`` is cheap: the manifest is read on first use. Use :meth:`take` to create
    one; :meth:`restore` and :meth:`read_object` to get state back.

    Args:
        path: where the snapshot lives: ``/local/dir``, ``file:///dir``, ``memory://name``, or
            any scheme a registered storage plugin serves.
        pg: the ``torch.distributed`` process group (default: the default group, or world size 1
            when torch.distributed is not initialized).
        storage_options: passed to the storage plugin (credentials, endpoints...).
    """

    def __init__(self, path: str, *, pg: Any | None = None, storage_options: dict[str, Any] | None = None) -> None:
        self.path = str(path)
        self.pg = pg
        self._storage_options = dict(storage_options or {})
        self._metadata: SnapshotMetadata | None = None

    def __repr__(self) -> str:
        return f"Snapshot({self.path!r})"

    @classmethod
    def take(
        cls,
        path: str,
        app_state: AppState,
        *,
        pg: Any | None = None,
        replicated: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        memory_budget_bytes: int | None = None,
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
            memory_budget_bytes: host bytes the pipeline may hold at once (default:
                ``SNAPSHOTKIT_MEMORY_BUDGET_BYTES``, else 60% of available RAM, at most 32 GiB).

        Returns:
            The committed snapshot.

        Raises:
            SnapshotExistsError: ``path`` already holds a snapshot (it is never overwritten).
            InvalidAppStateError: an ``app_state`` value is not Stateful.
            UnsupportedValueError: a leaf cannot be stored (unpicklable, meta tensor).
            RankFailedError: another rank failed (its error is the cause); nothing was committed.
            CollectiveTimeoutError: other ranks did not reach a step of the take in time.
        """
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
        group = resolve_group(pg, timeout_seconds=config.collective_timeout_seconds)
        options = dict(storage_options or {})
        target, metadata = take_on_group(
            str(path),
            app_state,
            group=group,
            config=config,
            replicated=list(replicated or ()),
            open_plugin=lambda where: url_to_storage_plugin(where, options),
        )
        snapshot = cls(target, pg=pg, storage_options=options)
        snapshot._metadata = metadata  # None on ranks other than 0: read on first use
        return snapshot

    @classmethod
    def async_take(
        cls,
        path: str,
        app_state: AppState,
        *,
        pg: Any | None = None,
        replicated: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        memory_budget_bytes: int | None = None,
        executor: str = "thread",
    ) -> PendingSnapshot:
        """Stage ``app_state`` and return; write and commit in the background.

        Returns once everything the caller could change has been copied: ``state_dict()`` was
        called, objects serialized, and every tensor piece copied into staging buffers (GPU
        tensors through pinned buffers on a side stream). From then on, nothing the caller does
        to its modules, optimizers or tensors changes the snapshot. Staging holds at most
        ``memory_budget_bytes`` at once: beyond it, ``async_take`` waits for background writes
        to drain. Another ``async_take`` while one is pending queues behind it (its writes go
        after the earlier ones; snapshots to different paths never mix).

        Args:
            executor: ``"thread"`` writes on snapshotkit's background I/O thread;
                ``"process"`` hands staged objects, through shared memory, to a checkpoint
                daemon process started on first use and reused, so checksumming and storage
                calls never compete with training for the GIL.
            Others: as for :meth:`take`.

        Returns:
            A :class:`PendingSnapshot`: ``wait()`` returns the committed :class:`Snapshot` or
            raises what went wrong; ``done()`` polls.
        """
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
        group = resolve_group(pg, timeout_seconds=config.collective_timeout_seconds)
        options = dict(storage_options or {})
        return async_take_on_group(
            str(path),
            app_state,
            group=group,
            config=config,
            replicated=list(replicated or ()),
            storage_options=options,
            executor=executor,
            snapshot_factory=lambda where: cls(where, pg=pg, storage_options=options),
        )

    def _plugin(self) -> StoragePlugin:
        return url_to_storage_plugin(self.path, self._storage_options)

    @property
    def metadata(self) -> SnapshotMetadata:
        """The decoded manifest (read once, then cached).

        Raises:
            SnapshotNotFoundError: nothing is at the path.
            IncompleteSnapshotError: data is there but the take never committed.
            ManifestError: the manifest is malformed or from a newer format version.
        """
        if self._metadata is None:
            with gc_paused():
                self._metadata = run_sync(self._load_metadata())
        return self._metadata

    async def _load_metadata(self) -> SnapshotMetadata:
        plugin = self._plugin()
        try:
            try:
                text = await plugin.read(METADATA_FILENAME)
            except BucketNotFoundError:
                raise
            except FileNotFoundError:
                leftovers: list[str] = []
                if plugin.capabilities.listing:
                    leftovers = await plugin.list("")
                if leftovers:
                    raise IncompleteSnapshotError(
                        f"{self.path!r} holds {len(leftovers)} object(s) but no {METADATA_FILENAME}: the take that "
                        "wrote it never committed (it failed or was interrupted), so it is not a snapshot. "
                        "Restore from an earlier snapshot and delete this path"
                    ) from None
                raise SnapshotNotFoundError(
                    f"no snapshot at {self.path!r} (no {METADATA_FILENAME} there); check the path"
                ) from None
        finally:
            await plugin.close()
        try:
            return SnapshotMetadata.from_text(bytes(text))
        except ManifestError as exc:
            raise type(exc)(f"{self.path}/{METADATA_FILENAME}: {exc}") from None

    def get_manifest(self) -> dict[str, Entry]:
        """A copy of the manifest: ``"<rank>/<logical path>"`` -> entry."""
        return copy.deepcopy(self.metadata.manifest)

    def restore(
        self,
        app_state: AppState,
        *,
        strict: bool = True,
        memory_budget_bytes: int | None = None,
        weights_only: bool = True,
        verify_checksums: bool | None = None,
    ) -> None:
        """Load the snapshot into the objects of ``app_state``, in place where possible.

        Tensors whose dtype and shape match the object's current ``state_dict()`` are filled in
        place (tied weights stay tied); the rest are loaded fresh and handed to
        ``load_state_dict()``. An :class:`~snapshotkit.RNGState` is loaded last.

        Args:
            app_state: a subset of the keys the snapshot was taken with.
            strict: refuse tensors whose shape/dtype differ from their destination and modules
                whose keys differ; with ``False`` such tensors load fresh and modules load with
                ``strict=False``.
            memory_budget_bytes: host bytes for bounce buffers at once (see :meth:`take`).
            weights_only: load pickled objects with ``torch.load(weights_only=True)``; pass
                ``False`` only for snapshots you trust.
            verify_checksums: check every piece's CRC-32C (default on, or
                ``SNAPSHOTKIT_VERIFY_CHECKSUMS``).

        Raises:
            LogicalPathNotFoundError: an app_state key is not in the snapshot.
            StateMismatchError: (strict) a tensor or module does not match.
            IntegrityError: stored bytes are corrupt or truncated.
        """
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=verify_checksums)
        group = resolve_group(self.pg, timeout_seconds=config.collective_timeout_seconds)
        error: BaseException | None = None
        try:
            self._restore_local(app_state, group.rank, config, strict=strict, weights_only=weights_only)
        except Exception as exc:
            error = exc
        # Every rank restored, or every rank raises (nobody trains on from a half-restored state).
        group.exchange(None, error, "restore: loading the state")

    def _restore_local(
        self, app_state: AppState, rank: int, config: Config, *, strict: bool, weights_only: bool
    ) -> None:
        states_of = validate_app_state(app_state)
        loader = LeafLoader(weights_only=weights_only)
        metadata = self.metadata
        with gc_paused():
            steps = plan_restore(
                rank_view(metadata, rank),
                states_of,
                strict=strict,
                loader=loader,
                snapshot_path=self.path,
                hint=lambda key: missing_key_hint(metadata, key, rank),
            )
            run_sync(self._fetch(loader, config))
        for step in steps:
            step()

    async def _fetch(self, loader: LeafLoader, config: Config) -> None:
        plugin = self._plugin()
        try:
            await read_pieces(
                plugin,
                loader.reads,
                budget=MemoryBudget(config.memory_budget_bytes),
                io_concurrency=config.io_concurrency,
                verify=config.verify_checksums,
            )
        finally:
            await plugin.close()

    def read_object(
        self,
        path: str,
        obj_out: T | None = None,
        *,
        memory_budget_bytes: int | None = None,
        weights_only: bool = True,
        verify_checksums: bool | None = None,
    ) -> T:
        """Read one value by logical path, without loading anything else.

        Args:
            path: a logical path such as ``"model/layer1.weight"`` (torchsnapshot's rank-prefixed
                ``"0/model/layer1.weight"`` works too). A container path (``"model"``) returns
                the whole subtree.
            obj_out: a tensor of the stored dtype and shape to load into in place; it is returned.
            memory_budget_bytes: host bytes for bounce buffers at once; large tensors are read
                in byte ranges of at most this size when they cannot land in place directly.
            weights_only: see :meth:`restore`.
            verify_checksums: see :meth:`restore`.

        Raises:
            LogicalPathNotFoundError: no such logical path (the message lists close matches).
            StateMismatchError: ``obj_out`` is a tensor of another dtype or shape.
        """
        group = resolve_group(self.pg)
        config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=verify_checksums)
        view, logical = self._resolve_logical_path(path, group.rank)
        entry = view[logical]
        loader = LeafLoader(weights_only=weights_only)
        if isinstance(entry, TensorEntry) and obj_out is not None:
            import torch

            if isinstance(obj_out, torch.Tensor) and not tensor_matches(entry, obj_out):
                raise describe_mismatch(logical, entry, obj_out)
        containers, leaves = subtree(view, logical)
        with gc_paused():
            if containers:
                thunks = {p: loader.add(p, e) for p, e in leaves.items()}
            else:
                thunks = {logical: loader.add(logical, entry, obj_out)}
            run_sync(self._fetch(loader, config))
        result: T = inflate(logical, containers, {p: thunk() for p, thunk in thunks.items()})
        return result

    def _resolve_logical_path(self, path: str, rank: int) -> tuple[dict[str, Entry], str]:
        """The rank view and logical path ``path`` names; ``"<rank>/..."`` selects that rank's view."""
        view = rank_view(self.metadata, rank)
        if path in view:
            return view, path
        head, _, rest = path.partition("/")
        if head.isdigit() and rest:
            prefixed_view = rank_view(self.metadata, int(head))
            if rest in prefixed_view:
                return prefixed_view, rest
        raise LogicalPathNotFoundError(
            f"logical path {path!r} is not in the snapshot at {self.path!r}{close_matches(path, view)}. "
            "List the paths with Snapshot(path).get_manifest()"
        )
