"""Rank 0's housekeeping of a manager's root: listing it, removing incomplete snapshots, retention.

Retention never breaks a snapshot it keeps: the policy picks the kept steps, then every step a
kept snapshot (or one the manager never deletes: not its own) lists in its ``bases`` is kept too,
and what is deleted goes referencing snapshots first (:mod:`snapshotkit._lifecycle.chains`).

Every storage call opens a plugin for the root, runs, and closes it; a failure becomes a
:class:`~snapshotkit.errors.StorageError` naming the root. Each deletion is logged at INFO and
emitted as an event (``snapshot_deleted`` or ``incomplete_removed``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from snapshotkit import _events
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.steps import RootListing, StepObjects, step_dir, step_of
from snapshotkit._lifecycle.catalog import (
    MANAGER_KEY,
    delete_snapshot,
    empty_step_dirs,
    list_root,
    manager_record,
    read_metadata,
    read_record,
)
from snapshotkit._lifecycle.chains import base_steps, deletion_order, since_full, with_bases
from snapshotkit._lifecycle.retention import RetentionPolicy, StepRecord, kept_steps
from snapshotkit._runtime.loop import run_sync
from snapshotkit.errors import SnapshotkitError, StorageError
from snapshotkit.storage import StoragePlugin, open_storage_plugin

T = TypeVar("T")
_log = logging.getLogger("snapshotkit.manager")


class RootJanitor:
    """Lists, cleans and prunes the ``step_<n>`` snapshots under ``root`` (one per manager).

    Thread-safe: the manager's background retention and its caller's thread share one instance;
    clean-up and retention run one at a time.
    """

    def __init__(self, root: str, storage_options: dict[str, Any]) -> None:
        self.root = root
        self._options = storage_options
        self._lock = threading.RLock()
        # committed step -> the manager's record in it (None: not the manager's); cached once
        # read or once committed by this manager, dropped when deleted
        self._records: dict[int, StepRecord | None] = {}
        # committed step -> the steps of this root its manifest lists as bases; cached once read
        self._bases: dict[int, frozenset[int]] = {}
        self._stray_reported = False

    def path(self, step: int) -> str:
        return f"{self.root}/{step_dir(step)}"

    def listing(self) -> RootListing:
        return self._noticed(self._run(list_root, f"listing {self.root!r}"))

    def _noticed(self, listing: RootListing) -> RootListing:
        """``listing``, after a WARNING (once per manager) if a snapshot sits at the root itself
        beside the steps: it is none of the manager's, so nothing here restores or deletes it."""
        with self._lock:
            report = listing.stray_snapshot and not self._stray_reported
            self._stray_reported = self._stray_reported or report
        if report:
            _log.warning(
                "%s holds a snapshot at the root itself (%s/%s and its data/, beside the step_<n> snapshots): "
                "a take into the root instead of into a step. It is not one of the manager's steps: it is never "
                "restored nor deleted. `snapshotkit ls %s` says how to move it into a step or remove it",
                self.root,
                self.root,
                METADATA_FILENAME,
                self.root,
            )
        return listing

    def remember(self, record: StepRecord) -> None:
        """``record``'s snapshot was just committed by this manager."""
        with self._lock:
            self._records[record.step] = record

    def cleanup(self, writing: int | None, *, dry_run: bool = False) -> tuple[list[int], RootListing]:
        """Remove incomplete snapshots except step ``writing`` (a save in flight); the steps
        removed (with ``dry_run``: that would be, and nothing is), and the listing (clean-up
        leaves its committed steps alone)."""
        with self._lock:
            listing, empty = self._run(_listing_and_empty_dirs, f"listing {self.root!r}")
            self._noticed(listing)
            removed: list[int] = []
            for step in sorted({*listing.incomplete, *empty} - {writing}):
                objects = listing.steps.get(step, StepObjects(step, ()))
                if not objects.only_ours:
                    _log.warning(
                        "not removing %s: it has no committed snapshot but holds objects snapshotkit does not write",
                        self.path(step),
                    )
                    continue
                if not dry_run:
                    self._delete(objects, "incomplete_removed")
                removed.append(step)
            return removed, listing

    def retain(self, policy: RetentionPolicy, *, dry_run: bool = False) -> list[int]:
        """Delete the committed snapshots the manager wrote that ``policy`` does not keep; the steps
        deleted (with ``dry_run``: that would be, and nothing is).

        Each one is read again right before it is deleted: it is deleted only if its manifest
        still says this manager wrote it for that step.
        """
        if not policy.deletes:
            return []
        with self._lock:
            listing = self.listing()
            records = self.load_records(listing.committed)
            bases_of = {step: self._bases.get(step, frozenset()) for step in listing.committed}
            kept = kept_steps([r for r in records.values() if r is not None], policy)
            # IMPORTANT: what is never deleted (kept, or not the manager's) keeps what it reads from
            never_deleted = kept | {step for step, record in records.items() if record is None}
            protected = with_bases(never_deleted, bases_of)
            doomed = [step for step, record in records.items() if record is not None and step not in protected]
            doomed = deletion_order(doomed, bases_of)
            if dry_run:
                return doomed
            deleted = []
            for step in doomed:
                if self._run(functools.partial(read_record, step=step), "reading a manifest") == records[step]:
                    self._delete(listing.steps[step], "snapshot_deleted")
                    deleted.append(step)
                self._records.pop(step, None)
                self._bases.pop(step, None)
            return deleted

    def load_records(self, steps: Sequence[int]) -> dict[int, StepRecord | None]:
        """The manager records of ``steps`` (each manifest read once, then cached with its bases)."""
        with self._lock:
            for step in [s for s in steps if s not in self._records or s not in self._bases]:
                metadata = self._run(functools.partial(read_metadata, step=step), "reading a manifest")
                if step not in self._records:
                    self._records[step] = manager_record(step, metadata.user_metadata) if metadata else None
                bases = metadata.bases if metadata is not None else {}
                self._bases[step] = base_steps(self.root, self.path(step), bases, step_of)
            return {s: self._records.get(s) for s in steps}

    def bases_of(self, step: int) -> frozenset[int]:
        """The steps of this root that ``step``'s snapshot reads from (its manifest read if not yet)."""
        self.load_records([step])
        with self._lock:
            return self._bases.get(step, frozenset())

    def chain_head(self) -> tuple[int, int] | None:
        """The newest committed step, if it can be a base, and the saves made since its last full
        one (0 without a manager's record saying otherwise); None when there is none, or its
        manifest is gone, fails its checks or predates snapshot ids (format version 4), or one of
        its own bases is gone or replaced (a take against it would reference that base too)."""
        committed = self.listing().committed
        if not committed:
            return None
        newest = committed[-1]
        metadata = self._run(functools.partial(read_metadata, step=newest), "reading a manifest")
        if metadata is None or metadata.snapshot_id is None:
            return None
        for location, base_id in metadata.bases.items():
            found = base_steps(self.root, self.path(newest), [location], step_of)
            if not found:
                return None  # a base outside the root's steps: not the manager's to vouch for
            base = self._run(functools.partial(read_metadata, step=min(found)), "reading a manifest")
            if base is None or base.snapshot_id != base_id:
                _log.warning(
                    "%s reads from %s, which is gone or replaced: the next save is full", self.path(newest), location
                )
                return None
        ours = manager_record(newest, metadata.user_metadata) is not None
        return newest, since_full(metadata.user_metadata.get(MANAGER_KEY)) if ours else 0

    def _delete(self, objects: StepObjects, kind: _events.EventKind) -> None:
        started = time.perf_counter()
        path = self.path(objects.step)
        self._run(functools.partial(delete_snapshot, objects=objects), f"deleting {path!r}")
        seconds = time.perf_counter() - started
        what = "deleted the snapshot" if kind == "snapshot_deleted" else "removed the incomplete snapshot"
        _log.info("%s %s (%d objects) in %.2f s", what, path, len(objects.locations), seconds)
        _events.emit(kind, path=path, step=objects.step, rank=0, seconds=seconds)

    def _run(self, call: Callable[[StoragePlugin], Coroutine[Any, Any, T]], what: str) -> T:
        return run_on_root(self.root, self._options, call, f"SnapshotManager: {what}")


def run_on_root(
    root: str, storage_options: Mapping[str, Any], call: Callable[[StoragePlugin], Coroutine[Any, Any, T]], what: str
) -> T:
    """Run ``call`` on a plugin opened for ``root``, then close it; a storage failure becomes a
    :class:`StorageError` saying ``what`` failed, naming the root, with the failure as its cause."""

    async def run() -> T:
        plugin = open_storage_plugin(root, dict(storage_options))
        try:
            return await call(plugin)
        finally:
            await plugin.close()

    try:
        return run_sync(run())
    except SnapshotkitError:
        raise
    except Exception as exc:
        raise StorageError(
            f"{what} failed: {type(exc).__name__}: {exc}. Check that the root {root!r} is reachable, the storage "
            "options (credentials, endpoint_url) and your permissions there"
        ) from exc


async def _listing_and_empty_dirs(plugin: StoragePlugin) -> tuple[RootListing, list[int]]:
    listing = await list_root(plugin)
    return listing, await empty_step_dirs(plugin, listing)
