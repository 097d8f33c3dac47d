"""The commit protocol of a take, the same for every writer, rank count and storage plugin.

IMPORTANT: the manifest is written last, with the plugin's exclusive write (fs: temporary file,
fsync, hard link; object stores: a conditional PUT), by rank 0 only, and only after every rank
reported that all its data objects were written. A take that fails or is interrupted before
that deletes what it wrote; in any case no manifest exists, so nothing half-written opens.

The steps, through a :class:`~snapshotkit._dist.Rendezvous` (collectives for ``take``, the
process group's store for ``async_take``'s background commit):

1. every rank turns its plan and checksums into a :class:`~snapshotkit._plan.merge.RankResult`
   (or reports its error) and rank 0 gathers them;
2. rank 0 merges the manifest and writes it exclusively;
3. rank 0's outcome reaches every rank, which raises if anything failed anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from collections.abc import Mapping, Sequence

import torch

from snapshotkit._dist import Rendezvous
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry, format_version_for
from snapshotkit._plan.decide import Decision
from snapshotkit._plan.layout import PieceSlot
from snapshotkit._plan.merge import RankResult, finish_rank, merge_results
from snapshotkit._plan.rank_plan import TakePlan
from snapshotkit._runtime.loop import run_sync
from snapshotkit._version import __version__
from snapshotkit.errors import SnapshotExistsError, SnapshotkitError, StorageError
from snapshotkit.storage import StoragePlugin, open_storage_plugin


@dataclasses.dataclass(frozen=True)
class CommitPlan:
    """What the commit needs once the data is staged (no tensors: the caller's state may go)."""

    path: str
    storage_options: Mapping[str, object]
    plan: TakePlan
    decision: Decision
    layouts: Mapping[str, str]
    world_size: int


def storage_error(exc: BaseException, path: str) -> BaseException:
    """The error a take raises for ``exc``: storage failures become :class:`StorageError`
    (with ``exc`` as the cause); snapshotkit's own errors and everything else pass unchanged."""
    if isinstance(exc, OSError) and not isinstance(exc, SnapshotkitError):
        error = StorageError(
            f"writing the snapshot at {path!r} failed: {type(exc).__name__}: {exc}. Nothing was committed; "
            "check the path, permissions and free space, then take again"
        )
        error.__cause__ = exc
        return error
    return exc


def build_metadata(manifest: dict[str, Entry], world_size: int) -> SnapshotMetadata:
    """The manifest document for ``manifest``, stamped with versions and the commit time."""
    return SnapshotMetadata(
        format_version=format_version_for(manifest),
        snapshotkit_version=__version__,
        torch_version=str(torch.__version__),
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        world_size=world_size,
        manifest=manifest,
    )


def _plugin(commit: CommitPlan) -> StoragePlugin:
    return open_storage_plugin(commit.path, dict(commit.storage_options))


async def _write_manifest(plugin: StoragePlugin, metadata: SnapshotMetadata, path: str) -> None:
    try:
        await plugin.write_exclusive(METADATA_FILENAME, metadata.to_bytes())
    except FileExistsError:
        raise SnapshotExistsError(
            f"another take committed a snapshot at {path!r} while this one was writing; "
            "this take's data was discarded. Use a new path for every snapshot"
        ) from None
    finally:
        await plugin.close()


def discard(commit: CommitPlan, locations: Sequence[str]) -> None:
    """Best-effort deletion of the data objects this rank wrote (the take's own error matters more)."""
    if not locations:
        return

    async def run() -> None:
        plugin = _plugin(commit)
        try:
            with contextlib.suppress(Exception):
                await plugin.discard(locations)
        finally:
            await plugin.close()

    with contextlib.suppress(Exception):
        run_sync(run())


def run_commit(
    commit: CommitPlan,
    rendezvous: Rendezvous,
    *,
    rank: int,
    checksums: Mapping[PieceSlot, int],
    error: BaseException | None,
    steps: tuple[str, str],
) -> SnapshotMetadata | None:
    """Run the commit protocol (module docstring); rank 0 returns the committed metadata.

    ``error`` is this rank's failure so far (staging or writing), ``steps`` name the two
    rendezvous steps in errors. Raises on every rank if anything failed on any rank.
    """
    result: RankResult | None = None
    if error is None:
        result = finish_rank(commit.plan, checksums)
    results = rendezvous.gather(result, error, steps[0])
    metadata: SnapshotMetadata | None = None
    commit_error: BaseException | None = None
    if rank == 0:
        assert results is not None
        try:
            metadata = build_metadata(merge_results(results, commit.decision, commit.layouts), commit.world_size)
            run_sync(_write_manifest(_plugin(commit), metadata, commit.path))
        except Exception as exc:
            commit_error = storage_error(exc, commit.path)
    rendezvous.settle(commit_error, steps[1])
    return metadata
