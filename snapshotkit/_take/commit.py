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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from snapshotkit._dist import Rendezvous
from snapshotkit._format.bases import new_snapshot_id
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry, format_version_for, pieces_of
from snapshotkit._format.pieces import Piece
from snapshotkit._plan.decide import Decision
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.merge import RankResult, finish_rank, merge_results
from snapshotkit._plan.rank_plan import PendingObject, PendingTensor, TakePlan
from snapshotkit._runtime.loop import run_sync
from snapshotkit._storage_failure import wrap_storage_failure
from snapshotkit._take.reuse import referenced_bases
from snapshotkit._version import __version__
from snapshotkit.errors import SnapshotExistsError
from snapshotkit.storage import StoragePlugin, open_storage_plugin


@dataclasses.dataclass(frozen=True)
class CommitPlan:
    """What the commit needs once the data is staged (no tensors: the caller's state may go).

    Stays in this process (never pickled for a writer); ``user_metadata`` is written by rank 0 only.
    ``base_ids`` maps every base location an incremental take may reference to its snapshot id.
    """

    path: str
    storage_options: Mapping[str, object]
    plan: TakePlan
    decision: Decision
    layouts: Mapping[str, str]
    world_size: int
    user_metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)


def storage_error(
    exc: BaseException,
    path: str,
    *,
    location: str | None = None,
    logical_paths: Iterable[str] = (),
    action: str = "writing",
) -> BaseException:
    """The error a take raises for ``exc``, which a storage call (``action`` ``location``) raised.

    The one place the take side wraps storage failures (:func:`~snapshotkit._storage_failure.wrap_storage_failure`,
    shared with the restore side): any exception a plugin raises becomes a :class:`StorageError`
    naming the path, the location and the logical paths stored there, with ``exc`` as the cause; a
    ``StorageError`` the plugin raised itself keeps its class and gains the same context.
    Snapshotkit's other errors, and interrupts, pass unchanged.
    """
    return wrap_storage_failure(
        exc,
        action=action,
        advice="Nothing was committed; check the path, permissions and free space (and that the store is "
        "reachable), then take again",
        location=location,
        path=path,
        logical_paths=logical_paths,
        whole="the storage",
    )


def logical_paths_in(plan: TakePlan, data_object: DataObjectPlan) -> list[str]:
    """The logical paths with pieces in ``data_object`` (for error messages)."""
    payloads = {slot.payload for slot in data_object.slots}
    in_object = set(data_object.slots)
    paths = {key.path for key, slot in plan.shared_slots.items() if slot in in_object}
    for key, entry in plan.entries.items():
        if isinstance(entry, (PendingTensor, PendingObject)) and entry.payload in payloads:
            paths.add(key.partition("/")[2])
    return sorted(paths)


def build_metadata(
    manifest: dict[str, Entry],
    world_size: int,
    user_metadata: Mapping[str, Any] | None = None,
    base_ids: Mapping[str, str] | None = None,
) -> SnapshotMetadata:
    """The manifest document for ``manifest``, stamped with versions, the commit time and a new
    snapshot id, holding ``user_metadata`` (already checked by
    :func:`~snapshotkit._format.user_metadata.check_user_metadata`) and the ``bases`` its pieces
    reference (their ids from ``base_ids``)."""
    pieces = [piece for entry in manifest.values() for piece in pieces_of(entry)]
    return SnapshotMetadata(
        format_version=format_version_for(manifest),
        snapshotkit_version=__version__,
        torch_version=str(torch.__version__),
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        world_size=world_size,
        manifest=manifest,
        user_metadata=dict(user_metadata or {}),
        snapshot_id=new_snapshot_id(),
        bases=referenced_bases(pieces, base_ids or {}),
    )


def _plugin(commit: CommitPlan) -> StoragePlugin:
    return open_storage_plugin(commit.path, dict(commit.storage_options))


async def write_manifest(plugin: StoragePlugin, document: bytes, path: str, *, writer: str = "take") -> None:
    """Commit: write the manifest ``document`` exclusively (the commit protocol's last step).

    ``writer`` names what is committing in the error when another snapshot got there first
    (``"take"``, ``"consolidate"``).

    Raises:
        SnapshotExistsError: a snapshot was committed at ``path`` meanwhile.
        StorageError: the store failed (the plugin's error is the cause).
    """
    try:
        await plugin.write_exclusive(METADATA_FILENAME, document)
    except FileExistsError:
        raise SnapshotExistsError(
            f"another snapshot was committed at {path!r} while this {writer} was writing; this {writer}'s data was "
            "discarded. Use a new path for every snapshot"
        ) from None
    except Exception as exc:
        raise storage_error(exc, path, location=METADATA_FILENAME)  # noqa: B904 - the cause is set


async def _write_manifest_and_close(plugin: StoragePlugin, document: bytes, path: str) -> None:
    try:
        await write_manifest(plugin, document, path)
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
    pieces: Mapping[PieceSlot, Piece],
    error: BaseException | None,
    steps: tuple[str, str],
) -> SnapshotMetadata | None:
    """Run the commit protocol (module docstring); rank 0 returns the committed metadata.

    ``error`` is this rank's failure so far (staging or writing), ``steps`` name the two
    rendezvous steps in errors. Raises on every rank if anything failed on any rank.
    """
    result: RankResult | None = None
    if error is None:
        result = finish_rank(commit.plan, pieces)
    results = rendezvous.gather(result, error, steps[0])
    metadata: SnapshotMetadata | None = None
    commit_error: BaseException | None = None
    if rank == 0:
        assert results is not None
        try:
            manifest = merge_results(results, commit.decision, commit.layouts)
            metadata = build_metadata(manifest, commit.world_size, commit.user_metadata, commit.base_ids)
            document = metadata.to_bytes()
            run_sync(_write_manifest_and_close(_plugin(commit), document, commit.path))
        except Exception as exc:
            commit_error = exc
    rendezvous.settle(commit_error, steps[1])
    return metadata
