"""The commit protocol of a take, the same for every writer, rank count and storage plugin.

IMPORTANT: the manifest is written last, with the plugin's exclusive write (fs: temporary file,
fsync, hard link; object stores: a conditional PUT), by rank 0 only, and only after every rank
reported that all its data objects were written. So nothing half-written ever opens. A take
replacing the snapshot at its path writes it with the plugin's atomic ``replace`` instead, and
deletes the old snapshot's data objects only after that (:mod:`~snapshotkit._take.replace`).

The steps, through a :class:`~snapshotkit._take.rendezvous.Rendezvous` (collectives for
``take``, the process group's store for ``async_take``'s background commit):

1. every rank turns its plan and checksums into a :class:`~snapshotkit._plan.merge.RankResult`
   (or reports its error, an interrupt included) and rank 0 gathers them;
2. rank 0 merges the manifest and writes it exclusively;
3. rank 0's verdict (committed, aborted, unknown) reaches every rank, which raises if anything
   failed anywhere.

IMPORTANT: who may delete what (:class:`CommitState`). A committed manifest must always have its
data, so once rank 0 *may* write a manifest referencing a rank's data objects, that rank deletes
them only when it knows no manifest exists:

* a rank that failed before or at step 1 (it reported an error, so rank 0 cannot commit) deletes;
* a failure every rank saw in the same exchange at step 1 (collectives) means an abort: all delete;
* rank 0, once its manifest write has started, deletes only if the write never took effect: it
  was refused as a duplicate, or it failed and reading the manifest back finds none. A write
  that failed after taking effect (a lost response, Ctrl-C just after it) is a commit;
* every other rank deletes only on rank 0's explicit ``ABORTED`` verdict. A timeout, an
  interrupt, or an ``UNKNOWN`` verdict keeps the data: if no manifest was written, the leftovers
  are an incomplete snapshot, which ``SnapshotManager`` and ``snapshotkit cleanup`` remove.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from snapshotkit._dist import RankOutcome, describe_error, rank_failed
from snapshotkit._format.bases import new_snapshot_id
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry, format_version_for, pieces_of
from snapshotkit._format.pieces import Piece
from snapshotkit._plan.decide import Decision
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.merge import RankResult, finish_rank, merge_results
from snapshotkit._plan.rank_plan import PendingObject, PendingTensor, TakePlan
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync, spawn
from snapshotkit._storage_failure import wrap_storage_failure
from snapshotkit._take.rendezvous import Outcome, Rendezvous, Verdict
from snapshotkit._take.replace import refuse_replaced_meanwhile, sweep
from snapshotkit._take.reuse import referenced_bases
from snapshotkit._text import first_few
from snapshotkit._version import __version__
from snapshotkit.errors import (
    Advice,
    CollectiveTimeoutError,
    CommitOutcomeUnknownError,
    SnapshotExistsError,
)
from snapshotkit.storage import StoragePlugin, open_storage_plugin

logger = logging.getLogger("snapshotkit.take")
_NOTHING_COMMITTED = "nothing was committed"


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
    #: A take replacing the snapshot at ``path`` (:mod:`~snapshotkit._take.replace`): the manifest
    #: is written with the plugin's atomic ``replace``, and ``stale`` (rank 0: the data objects
    #: there before the take) are deleted after the commit where the new manifest does not use them.
    replace: bool = False
    stale: tuple[str, ...] = ()
    #: The digest of the manifest a replacing take replaces (rank 0), checked just before the commit.
    replaced: str = ""


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


@dataclasses.dataclass
class CommitState:
    """How far this rank got in the protocol, which decides whether its data objects may go.

    ``may_delete`` starts true; it turns false once a manifest may reference this rank's data
    (it reported success to rank 0; on rank 0, the manifest write started) and true again only
    when it is known that no manifest exists (module docstring).
    """

    may_delete: bool = True
    #: Why the data stays, when it does (for the WARNING that says so).
    kept_because: str = ""

    def keep(self, because: str) -> None:
        self.may_delete, self.kept_because = False, because


def _plugin(commit: CommitPlan) -> StoragePlugin:
    return open_storage_plugin(commit.path, dict(commit.storage_options))


async def write_manifest(
    plugin: StoragePlugin, document: bytes, path: str, *, writer: str = "take", replace: bool = False
) -> None:
    """Commit: write the manifest ``document`` exclusively (the commit protocol's last step); with
    ``replace``, atomically over the manifest there (a take replacing the snapshot at ``path``).

    ``writer`` names what is committing in the error when another snapshot got there first
    (``"take"``, ``"consolidate"``).

    Raises:
        SnapshotExistsError: a snapshot was committed at ``path`` meanwhile.
        StorageError: the store failed (the plugin's error is the cause).
    """
    try:
        if replace:
            await plugin.replace(METADATA_FILENAME, document)
        else:
            await plugin.write_exclusive(METADATA_FILENAME, document)
    except FileExistsError:
        problem = (
            f"another snapshot was committed at {path!r} while this {writer} was writing; this {writer}'s data was "
            "discarded"
        )
        error = SnapshotExistsError(f"{problem}. Use a new path for every snapshot")
        raise error.advised(Advice(problem, "new_destination", (path,))) from None
    except Exception as exc:
        raise storage_error(exc, path, location=METADATA_FILENAME)  # noqa: B904 - the cause is set


async def _write_manifest_and_close(commit: CommitPlan, document: bytes) -> None:
    plugin = _plugin(commit)
    try:
        if commit.replace:
            try:
                await refuse_replaced_meanwhile(plugin, commit.path, commit.replaced)
            except Exception as exc:  # SnapshotExistsError passes unchanged
                raise storage_error(exc, commit.path, location=METADATA_FILENAME, action="reading")  # noqa: B904
        await write_manifest(plugin, document, commit.path, replace=commit.replace)
    finally:
        await plugin.close()


async def _read_manifest(commit: CommitPlan) -> bytes | None:
    plugin = _plugin(commit)
    try:
        return bytes(await plugin.read(METADATA_FILENAME))
    except FileNotFoundError:
        return None
    finally:
        await plugin.close()


def _commit_manifest(commit: CommitPlan, document: bytes) -> tuple[Outcome, BaseException | None]:
    """Rank 0's step 2: write the manifest and say whether it is there, with the failure (if any).

    A write that raised (or was interrupted) is stopped and waited for, then the manifest is read
    back (also after a refusal as a duplicate: a retried write may have been refused by its own
    earlier attempt): ours there is a commit, nothing (or another take's, or the manifest a
    replacing take was to replace) an abort, and a write
    that would not stop, or a store that cannot be read, leaves the outcome unknown.
    """
    spawned = spawn(_write_manifest_and_close(commit, document))
    try:
        spawned.result()
    except BaseException as exc:
        spawned.cancel()  # an interrupt of this thread: stop the write, and wait until it stopped
        if not spawned.settled:
            return Outcome.UNKNOWN, exc
        try:
            stored = run_sync(_read_manifest(commit))
        except BaseException:
            return Outcome.UNKNOWN, exc
        return (Outcome.COMMITTED if stored == document else Outcome.ABORTED), exc
    return Outcome.COMMITTED, None


def _outcome_unknown(path: str, detail: str, *, rank: int) -> CommitOutcomeUnknownError:
    who = "this rank" if rank == 0 else "rank 0"
    return CommitOutcomeUnknownError(
        f"the manifest write of the snapshot at {path!r} failed ({detail}) and {who} could not tell whether it was "
        f"committed, so every rank kept its data objects. Open {path!r} to see whether the snapshot exists; if it "
        "does not, SnapshotManager or `snapshotkit cleanup` removes the leftovers"
    )


def _kept_after_timeout(exc: CollectiveTimeoutError, path: str) -> CollectiveTimeoutError:
    error = CollectiveTimeoutError(
        f"{exc} Whether rank 0 committed the snapshot at {path!r} is unknown, so this rank's data objects were "
        "kept: open the path to see whether it exists; if it does not, SnapshotManager or `snapshotkit cleanup` "
        "removes the leftovers"
    )
    error.__cause__ = exc.__cause__
    return error


def run_commit(
    commit: CommitPlan,
    rendezvous: Rendezvous,
    *,
    rank: int,
    pieces: Mapping[PieceSlot, Piece],
    error: BaseException | None,
    steps: tuple[str, str],
    state: CommitState,
) -> SnapshotMetadata | None:
    """Run the commit protocol (module docstring); rank 0 returns the committed metadata.

    ``error`` is this rank's failure so far (staging, writing, an interrupt while waiting),
    ``steps`` name the two rendezvous steps in errors, ``state`` tells the caller afterwards
    whether this rank's data objects may be deleted. Raises on every rank if anything failed on
    any rank (an interrupt is re-raised as itself).
    """
    result: RankResult | None = None
    if error is None:
        try:
            with gc_paused():  # 20,000 entries make ~125 collections (async_take: on the coordinator thread)
                result = finish_rank(commit.plan, pieces)
        except BaseException as exc:  # an interrupt included: reported to the other ranks first
            error = exc
    if rank != 0 and error is None:  # from here rank 0 may commit a manifest referencing this rank's data
        state.keep("rank 0 may have committed a manifest that references them")
    try:
        gathered = rendezvous.gather(result, error, steps[0])
    except BaseException as exc:
        if rank == 0 and rendezvous.publishes_after_interrupt:
            with contextlib.suppress(Exception):
                rendezvous.settle(Verdict.of(Outcome.ABORTED, error or exc), steps[1])
        if isinstance(exc, CollectiveTimeoutError) and not state.may_delete:
            raise _kept_after_timeout(exc, commit.path) from exc.__cause__
        if error is not None and isinstance(exc, Exception):
            raise error from None
        raise
    if error is not None or gathered.failed:
        failure = error if error is not None else rank_failed(steps[0], gathered.failed, _NOTHING_COMMITTED)
        if gathered.shared:  # every rank saw the failure: nobody commits
            state.may_delete = True
        elif rank == 0:
            failing_rank, outcome = gathered.failed[0]
            verdict = Verdict(Outcome.ABORTED, failing_rank, outcome.error, outcome.error_text)
            with contextlib.suppress(Exception):
                rendezvous.settle(verdict, steps[1])
        raise failure
    if rank == 0:
        assert gathered.values is not None
        return _commit_as_rank_0(commit, rendezvous, gathered.values, steps[1], state)
    try:
        verdict = rendezvous.settle(None, steps[1])
    except CollectiveTimeoutError as exc:
        raise _kept_after_timeout(exc, commit.path) from exc.__cause__
    if verdict.outcome is Outcome.COMMITTED:
        return None
    if verdict.outcome is Outcome.ABORTED:
        state.may_delete = True
        raise rank_failed(steps[1], [(verdict.failing_rank, _as_rank_outcome(verdict))], _NOTHING_COMMITTED)
    raise _outcome_unknown(commit.path, verdict.error_text, rank=rank) from verdict.error


def _as_rank_outcome(verdict: Verdict) -> RankOutcome:
    return RankOutcome(None, verdict.error, verdict.error_text)


def _commit_as_rank_0(
    commit: CommitPlan, rendezvous: Rendezvous, results: Sequence[Any], what: str, state: CommitState
) -> SnapshotMetadata:
    """Rank 0's steps 2 and 3: merge and write the manifest, then publish the verdict."""
    metadata: SnapshotMetadata | None = None
    failure: BaseException | None
    try:
        with gc_paused():
            manifest = merge_results(list(results), commit.decision, commit.layouts)
            metadata = build_metadata(manifest, commit.world_size, commit.user_metadata, commit.base_ids)
            document = metadata.to_bytes()
    except BaseException as exc:  # nothing was written
        outcome, failure = Outcome.ABORTED, exc
    else:
        state.keep("the manifest write had started")
        outcome, failure = _commit_manifest(commit, document)
    if outcome is Outcome.ABORTED:
        state.may_delete = True
    else:
        state.keep(
            "the snapshot was committed" if outcome is Outcome.COMMITTED else "its manifest may have been written"
        )
    try:
        rendezvous.settle(Verdict.of(outcome, failure), what)
    except BaseException as exc:
        if failure is None and outcome is Outcome.COMMITTED and isinstance(exc, Exception):
            logger.warning("committed the snapshot at %s, but the other ranks could not be told: %s", commit.path, exc)
        elif failure is None:
            failure = exc
    if outcome is Outcome.COMMITTED:
        assert metadata is not None
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # an interrupt: the snapshot is committed all the same
        if failure is not None:
            logger.warning(
                "the manifest of the snapshot at %s was written (read back intact), although the store reported "
                "an error: %s; the snapshot is committed",
                commit.path,
                describe_error(failure.__cause__ or failure),
            )
        if commit.replace:
            sweep(commit.path, commit.storage_options, commit.stale, metadata)
        return metadata
    assert failure is not None
    if outcome is Outcome.UNKNOWN and isinstance(failure, Exception):
        raise _outcome_unknown(commit.path, str(failure), rank=0) from failure
    raise failure


def discard(commit: CommitPlan, locations: Sequence[str]) -> None:
    """Delete the data objects this rank wrote, for a take that did not commit.

    The take's own error matters more: a failure here is not raised but logged as a WARNING that
    names what was left (an incomplete snapshot's leftovers, which SnapshotManager and
    ``snapshotkit cleanup`` remove).
    """
    discard_at(commit.path, commit.storage_options, locations)


def discard_at(path: str, storage_options: Mapping[str, object], locations: Sequence[str]) -> None:
    """:func:`discard` for the data objects at ``locations`` of the snapshot at ``path``."""
    if not locations:
        return

    async def run() -> None:
        plugin = open_storage_plugin(path, dict(storage_options))
        try:
            await plugin.discard(locations)
        finally:
            await plugin.close()

    try:
        run_sync(run())
    except BaseException as exc:
        logger.warning(
            "could not delete the data objects a failed take wrote under %s (of the %d it started: %s): %s: %s. "
            "What was written is left as an incomplete snapshot; SnapshotManager or `snapshotkit cleanup` removes it",
            path,
            len(locations),
            first_few(list(locations), show=str),
            type(exc).__name__,
            exc,
        )


def keep(commit: CommitPlan, locations: Sequence[str], error: BaseException, because: str) -> None:
    """Log that a failed take kept its data objects, and ``because`` of what."""
    if locations:
        logger.warning(
            "kept the %d data object(s) this rank wrote under %s although the take raised %s: %s",
            len(locations),
            commit.path,
            type(error).__name__,
            because,
        )
