"""The handle on a take being written in the background, whatever the caller makes of the result.

:class:`PendingTake` knows the take's job, not the facade: what :meth:`~PendingTake.wait` returns
is what the callable it was given makes of the committed manifest. The public
:class:`snapshotkit.PendingSnapshot` (in :mod:`snapshotkit.snapshot`) is the ``PendingTake``
whose result is the committed :class:`~snapshotkit.Snapshot`, so this module imports nothing of
the facade and the facade imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from snapshotkit._format.document import SnapshotMetadata

__all__ = ["BackgroundJob", "PendingTake"]

#: What the take becomes once committed (a :class:`~snapshotkit.Snapshot` for ``PendingSnapshot``).
R = TypeVar("R")


class BackgroundJob(Protocol):
    """What a :class:`PendingTake` waits on: a :class:`~snapshotkit._take.job.TakeJob`, or the local
    tier's promotion of a copy (:class:`~snapshotkit._tier.promote.PromotionJob`)."""

    path: str

    def done(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> SnapshotMetadata | None: ...


class PendingTake(Generic[R]):
    """A take being written in the background; :meth:`wait` gives the committed snapshot.

    Args:
        job: the take's background job.
        pg: the process group of the take.
        committed: makes the result from the committed manifest (``None`` on ranks other than 0,
            which read it on first use); called by every :meth:`wait` that returns.

    Attributes:
        path: where the snapshot is being written (rank 0's path).
        pg: the process group of the take.
    """

    def __init__(self, job: BackgroundJob, pg: Any, committed: Callable[[SnapshotMetadata | None], R]) -> None:
        self.path = job.path
        self.pg = pg
        self._job = job
        self._committed = committed

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"{type(self).__name__}({self.path!r}, {state})"

    def done(self) -> bool:
        """Whether the background work finished (committed, or failed)."""
        return self._job.done()

    def wait(self, timeout: float | None = None) -> R:
        """Block until the take is committed and return what ``committed`` makes of it; raise what
        went wrong (:meth:`snapshotkit.PendingSnapshot.wait` lists it)."""
        return self._committed(self._job.wait(timeout))
