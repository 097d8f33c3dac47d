"""A snapshot being written in the background: what :meth:`Snapshot.async_take <snapshotkit.Snapshot.async_take>`
returns (re-exported by :mod:`snapshotkit.snapshot` and :mod:`snapshotkit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapshotkit._take import engine as take_engine

if TYPE_CHECKING:
    from snapshotkit.snapshot import Snapshot

__all__ = ["PendingSnapshot"]


class PendingSnapshot:
    """A snapshot being written in the background; :meth:`wait` gives the committed :class:`Snapshot`.

    Attributes:
        path: where the snapshot is being written (rank 0's path).
        pg: the process group of the take.
    """

    def __init__(self, job: take_engine.TakeJob, snapshot: Snapshot) -> None:
        self.path = job.path
        self.pg = snapshot.pg
        self._job = job
        self._snapshot = snapshot

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"PendingSnapshot({self.path!r}, {state})"

    def done(self) -> bool:
        """Whether the background work finished (committed, or failed)."""
        return self._job.done()

    def wait(self, timeout: float | None = None) -> Snapshot:
        """Block until the snapshot is committed and return it; raise what went wrong.

        Raises:
            WaitTimeoutError: ``timeout`` seconds passed first; the snapshot keeps being
                written and ``wait`` may be called again.
            RankFailedError: another rank's writes failed (its error is the cause).
            CheckpointDaemonError: the checkpoint daemon died.
            StorageError, ...: this rank's own failure, as ``take`` would raise it.
        """
        metadata = self._job.wait(timeout)
        if metadata is not None and self._snapshot._metadata is None:
            self._snapshot._metadata = metadata
        return self._snapshot
