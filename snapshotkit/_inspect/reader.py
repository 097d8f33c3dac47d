"""Reading a snapshot piece by piece for tools: the restore side's fetch pipeline, one plugin, one budget.

Everything goes through :mod:`snapshotkit._restore.fetch` (ranged reads merged into batches,
large pieces in budget-sized sub-ranges, every checksum verified) and the restore side's error
wrapping, so a tool reports damage and storage failures exactly as a restore would.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from snapshotkit._config import Config
from snapshotkit._format.entries import Entry
from snapshotkit._restore.bases import open_snapshot_storage
from snapshotkit._restore.failures import open_failure
from snapshotkit._restore.fetch import Claim, PieceRead, check_extents, read_pieces
from snapshotkit._restore.place import LeafLoader
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.frames import drop_frames
from snapshotkit._runtime.loop import run_sync
from snapshotkit.storage import StoragePlugin

T = TypeVar("T")


class SnapshotReader:
    """Reads the pieces of the snapshot at ``path`` through one storage plugin (a context manager).

    Attributes:
        path: the snapshot's path or URI.
        config: the configuration of the reads (budget, I/O concurrency).
        budget: the one memory budget every read of this reader shares (another reader's, if
            given: two snapshots compared under one budget).
        bases: the manifest's ``bases`` (an incremental snapshot's references are read from them).
        plugin: the storage plugin (opened on construction, closed by :meth:`close`).
    """

    def __init__(
        self,
        path: str,
        storage_options: Mapping[str, Any] | None,
        config: Config,
        budget: MemoryBudget | None = None,
        bases: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.config = config
        self.budget = budget if budget is not None else MemoryBudget(config.memory_budget_bytes)
        try:
            self.plugin: StoragePlugin = open_snapshot_storage(path, dict(storage_options or {}), bases or {})
        except Exception as exc:
            raise open_failure(exc, path)  # noqa: B904 - the cause is set by open_failure

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        run_sync(self.plugin.close())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on snapshotkit's loop; a failure's buffers are freed when it is raised."""
        try:
            return run_sync(coro)
        except Exception as exc:
            drop_frames(exc)
            raise

    async def fetch(self, reads: Sequence[PieceRead]) -> int:
        """Fetch and verify ``reads`` (see :func:`~snapshotkit._restore.fetch.read_pieces`); the bytes read."""
        return await read_pieces(
            self.plugin, reads, budget=self.budget, io_concurrency=self.config.io_concurrency, verify=True
        )

    async def prove(self, claims: Sequence[Claim]) -> None:
        """Prove the data objects hold the claimed pieces before memory is allocated for them."""
        await check_extents(self.plugin, claims, io_concurrency=self.config.io_concurrency)

    def load(self, entries: Mapping[str, Entry], *, weights_only: bool = True) -> dict[str, Any]:
        """The values of leaf ``entries`` (logical path -> entry), read together as a restore reads them.

        Tensors are new tensors of the stored dtype and shape; objects are unpickled with
        ``weights_only``.
        """
        loader = LeafLoader(weights_only=weights_only)
        thunks = {path: loader.add(path, entry) for path, entry in entries.items()}
        self.run(self._load(loader))
        return {path: thunk() for path, thunk in thunks.items()}

    async def _load(self, loader: LeafLoader) -> None:
        await self.prove(loader.claims)
        loader.allocate()
        await self.fetch(loader.reads)
