"""The snapshot manager: a root of ``step_<n>`` snapshots, kept by policy, resumed from the newest good one.

    mgr = SnapshotManager("s3://bucket/run7", keep_last=3, save_interval_steps=1_000)
    step = mgr.restore_latest(app_state) or 0
    while step < total_steps:
        train_step(); step += 1
        if mgr.should_save(step):
            mgr.save(step, app_state, metrics={"val_loss": loss}, async_take=True)
    mgr.close()

The manager orchestrates; listing, retention, deletion and signal handling live in
:mod:`snapshotkit._lifecycle`. It keeps no side file: what a root holds is what its snapshots'
manifests say (the step, metrics and reason of each save are in the snapshot's user metadata).
"""

from __future__ import annotations

import logging
import secrets
import signal
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from snapshotkit import _events
from snapshotkit._app_state import validate_app_state
from snapshotkit._config import Config, snapshot_path
from snapshotkit._dist import resolve_group
from snapshotkit._format.steps import RootListing, step_dir
from snapshotkit._lifecycle import fallback
from snapshotkit._lifecycle.background import BackgroundRetention
from snapshotkit._lifecycle.catalog import MANAGER_KEY, manager_record
from snapshotkit._lifecycle.chains import SavePlan, check_incremental, plan_save
from snapshotkit._lifecycle.janitor import RootJanitor
from snapshotkit._lifecycle.preemption import NoticeAgreement, PreemptionWatcher
from snapshotkit._lifecycle.retention import RetentionPolicy, StepRecord, best_steps
from snapshotkit._lifecycle.values import (
    check_check_every,
    check_interval,
    check_metadata,
    check_signals,
    check_step,
    check_take_keywords,
    clean_metrics,
    on_interval,
)
from snapshotkit._restore.partial import RestoreReport
from snapshotkit._take.executors import EXECUTORS
from snapshotkit._take.prepare import refuse_process_local
from snapshotkit._tier.recover import resume
from snapshotkit._tier.tier import LocalTier, check_tier_options
from snapshotkit.errors import (
    ConfigError,
    InvalidArgumentError,
    SnapshotExistsError,
    SnapshotNotFoundError,
)
from snapshotkit.snapshot import PendingSnapshot, Snapshot
from snapshotkit.stateful import AppState

__all__ = ["SnapshotManager"]

T = TypeVar("T")
_log = logging.getLogger("snapshotkit.manager")
_DEFAULT_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s)


class SnapshotManager:
    """Snapshots of one training run under ``root``, one per step at ``<root>/step_<step>``.

    Every rank of a distributed job constructs the manager and calls :meth:`save`,
    :meth:`restore_latest` and :meth:`should_save` at the same points (they are collective);
    rank 0 alone applies retention and deletes. Construction removes the leftovers of takes that
    never committed (see :meth:`cleanup`) and installs the preemption signal handlers.

    Args:
        root: the directory or URI prefix holding the run's snapshots (any URL ``Snapshot`` opens).
        keep_last: keep the newest this many snapshots (None: no limit by recency).
        keep_every: also keep every snapshot whose step is a multiple of this.
        best_metric: the metric :meth:`best_step` and ``keep_best`` rank by.
        best_mode: ``"min"`` (lower is better, a loss) or ``"max"`` (an accuracy).
        keep_best: also keep the best this many by ``best_metric``.
        save_interval_steps: :meth:`should_save` is true at multiples of this.
        pg: the ``torch.distributed`` process group (see :class:`~snapshotkit.Snapshot`).
        storage_options: passed to the storage plugin.
        preemption_signals: signals that announce a preemption (default SIGTERM and SIGUSR1); a
            previous Python handler is chained; ``()`` installs nothing (:meth:`request_preemption`
            still records a notice).
        preemption_check_every: with many ranks, :meth:`should_save` agrees on a notice every this many calls
            (1: every call), so a notice is acted on at most this many calls after it arrived.
        cleanup_incomplete: remove incomplete snapshots when the manager opens the root.
        incremental: take each save against the newest committed snapshot under the root
            (``Snapshot.take(..., base=...)``: pieces whose bytes it already holds are referenced,
            not written again).
        full_every: with ``incremental``, every this many saves is a full snapshot (the first
            save is; then ``full_every - 1`` incremental ones), so chains stay short. The count
            continues from the newest snapshot's record when a manager reopens the root.
        async_executor: the ``executor`` of ``save(async_take=True)`` unless it passes one. The
            manager warms it up (:meth:`Snapshot.prepare_async`) at the end of
            :meth:`restore_latest`, so the first async save blocks about as long as later ones;
            this holds staging buffers of about the state's size. None: no warm-up.
        local_root: this node's directory for the fast-recovery tier (a local disk or a RAM-backed
            file system; each node passes its own): every ``local_interval_steps`` steps each rank
            saves its own state there, alone, and :meth:`restore_latest` prefers these copies
            (docs/lifecycle.md, "Tiers"). None: no local tier.
        local_interval_steps: a local save at every multiple of this (needs ``local_root``).
        local_keep_last: keep the newest this many local steps.
        local_replicas: also keep each rank's local save on this many other nodes (sent over the
            process group after it committed), so that a lost node's state is served by a peer.
            Nodes are told apart by host name, or ``SNAPSHOTKIT_NODE_ID``.
        local_promote: ``save(async_take=True)`` at a step due on both tiers takes the durable
            snapshot from the local copy in the background, not from memory again (docs/lifecycle.md).

    With neither ``keep_last`` nor ``keep_best``, nothing is ever deleted. The newest snapshot is
    always kept. Only snapshots a manager wrote are deleted: anything else under the root (a
    snapshot taken by hand, a foreign checkpoint, a file) is never touched. A snapshot that a kept
    ``step_<n>`` snapshot reads from (its manifest's ``bases``) is kept as long as that one is.

    Raises:
        InvalidArgumentError, ConfigError: an argument is of the wrong type or out of range;
            ``async_executor="process"`` with a process-local root (``memory://``).
        StorageError: the root could not be listed.
    """

    def __init__(
        self,
        root: str,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        best_metric: str | None = None,
        best_mode: str = "min",
        keep_best: int | None = None,
        save_interval_steps: int | None = None,
        pg: Any | None = None,
        storage_options: dict[str, Any] | None = None,
        preemption_signals: Sequence[int] = _DEFAULT_SIGNALS,
        cleanup_incomplete: bool = True,
        incremental: bool = False,
        full_every: int = 10,
        async_executor: str | None = "thread",
        preemption_check_every: int = 10,
        local_root: str | None = None,
        local_interval_steps: int | None = None,
        local_keep_last: int = 2,
        local_replicas: int = 0,
        local_promote: bool = True,
    ) -> None:
        self.root = snapshot_path(root).rstrip("/")
        self.incremental, self.full_every = check_incremental(incremental, full_every)
        self.policy = RetentionPolicy(keep_last, keep_every, keep_best, best_metric, best_mode)  # type: ignore[arg-type]
        self.save_interval_steps = check_interval(save_interval_steps)
        signals, check_every = check_signals(preemption_signals), check_check_every(preemption_check_every)
        if not isinstance(cleanup_incomplete, bool):
            raise InvalidArgumentError(f"cleanup_incomplete must be True or False, got {cleanup_incomplete!r}")
        if async_executor is not None and async_executor not in EXECUTORS:
            raise ConfigError(f"async_executor must be one of {EXECUTORS} or None, got {async_executor!r}")
        tier_options = check_tier_options(
            local_root, local_interval_steps, local_keep_last, local_replicas, local_promote
        )
        self.pg, self.async_executor = pg, async_executor
        self._options = dict(storage_options or {})
        if async_executor == "process":
            refuse_process_local(self.root, self._options, caller='SnapshotManager(async_executor="process")')
        self._group = resolve_group(pg, timeout_seconds=Config.resolve().collective_timeout_seconds)
        self._janitor = RootJanitor(self.root, self._options)
        self._pending: PendingSnapshot | None = None
        self._pending_step: int | None = None
        self._pending_for_preemption = False
        self.last_restore_report: RestoreReport | None = None
        self._retention = BackgroundRetention(self._janitor, self.policy, lambda: self._closed)
        self._preemption_saved = False
        self._closed = False
        error: BaseException | None = None
        committed: list[int] = []
        try:
            if self._group.rank == 0:
                committed = (self._cleanup()[1] if cleanup_incomplete else self._janitor.listing()).committed
        except Exception as exc:
            error = exc
        agreed = self._group.exchange((committed, secrets.token_hex(8)), error, "SnapshotManager: listing the root")[0]
        self._steps: set[int] = set(agreed[0])
        self._watcher = PreemptionWatcher(signals)
        self._notices = NoticeAgreement(self._group, self._watcher, check_every, agreed[1])
        self._tier = LocalTier(self._group, tier_options) if tier_options is not None else None
        weakref.finalize(self, self._watcher.close)  # a manager never closed still gives the signals back

    def __repr__(self) -> str:
        return f"SnapshotManager({self.root!r})"

    def __enter__(self) -> SnapshotManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._shut_down(wait=False)  # another rank may be gone: wait for nobody

    # ------------------------------------------------------------------ what the root holds

    def snapshot_path(self, step: int) -> str:
        """Where the snapshot of ``step`` lives: ``<root>/step_<step>``."""
        return f"{self.root}/{step_dir(check_step(step))}"

    def steps(self) -> list[int]:
        """The steps with a committed snapshot under the root, ascending (listed now, on this rank)."""
        return self._janitor.listing().committed

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The committed step with the best ``best_metric`` (None if none has a finite value).

        Raises:
            ConfigError: the manager has no ``best_metric``.
        """
        if self.policy.best_metric is None:
            raise ConfigError("best_step() needs best_metric: SnapshotManager(..., best_metric='val_loss')")
        records = [r for r in self._janitor.load_records(self.steps()).values() if r is not None]
        best = best_steps(records, self.policy.best_metric, self.policy.best_mode, 1)
        return best[0] if best else None

    def snapshot(self, step: int) -> Snapshot:
        """The committed snapshot of ``step``.

        Raises:
            SnapshotNotFoundError: no committed snapshot for that step (the message lists them).
        """
        step = check_step(step)
        steps = self.steps()
        if step not in steps:
            raise SnapshotNotFoundError(
                f"no committed snapshot for step {step} under {self.root!r}; "
                f"committed steps: {fallback.shown_steps(steps)}"
            )
        return Snapshot(self.snapshot_path(step), pg=self.pg, storage_options=self._options)

    def metrics(self, step: int) -> dict[str, float | None]:
        """The metrics saved with ``step`` (``{}`` for a snapshot the manager did not write).

        Raises:
            SnapshotNotFoundError: no committed snapshot for that step.
        """
        record = manager_record(step, self.snapshot(step).metadata.user_metadata)
        return dict(record.metrics) if record is not None else {}

    # ------------------------------------------------------------------ saving

    @property
    def preemption_received(self) -> bool:
        """Whether a preemption notice arrived: with many ranks, on any rank as of the last
        :meth:`should_save` (so every rank answers alike); on one, as soon as it arrived."""
        return self._notices.received

    @property
    def preemption_saved(self) -> bool:
        """Whether the save for a preemption notice was made: the loop should stop now
        (after :meth:`close`, which waits for it to commit)."""
        return self._preemption_saved

    def request_preemption(self) -> None:
        """Record a preemption notice by hand (for schedulers that announce it other than by signal)."""
        self._watcher.request()

    def should_save(self, step: int) -> bool:
        """Whether to save at ``step``: a multiple of ``save_interval_steps``, or a preemption notice
        arrived and was not saved for yet; never for a step that already has a snapshot.

        With many ranks, call it on every rank at every step: every ``preemption_check_every`` calls
        the ranks agree, through the process group's store, whether any received a notice (by signal
        or :meth:`request_preemption`); the calls between communicate nothing.

        Raises:
            CollectiveTimeoutError: at an agreement, another rank did not call it in time.
        """
        notice = self._notices.poll(step := check_step(step))
        if self._tier is not None and self._tier.wants(step):
            return True
        if step in self._steps:
            return False
        return (notice and not self._preemption_saved) or on_interval(step, self.save_interval_steps)

    def save(
        self,
        step: int,
        app_state: AppState,
        *,
        metrics: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        async_take: bool = False,
        **take_kwargs: Any,
    ) -> Snapshot | PendingSnapshot:
        """Take the snapshot of ``step``, then apply retention once it is committed.

        At most one save is in flight: a save waits for the previous ``async_take`` save first.
        Retention runs in the background on rank 0 and never blocks the caller.

        Args:
            step: the training step (an int >= 0); the snapshot goes to ``<root>/step_<step>``.
            app_state: as for :meth:`Snapshot.take`.
            metrics: numbers to keep with the snapshot (0-d tensors are fine); ``best_metric``
                is read from here. None and values that are not finite are stored as None. With
                many ranks, rank 0's metrics and metadata are the ones stored.
            metadata: more JSON-serializable user metadata for the snapshot.
            async_take: use :meth:`Snapshot.async_take` and return once the state is staged.
            take_kwargs: passed on (``replicated``, ``memory_budget_bytes``, ``include``,
                ``exclude``, ``executor``...; ``base`` only when the manager is not incremental).

        Returns:
            The committed :class:`Snapshot`, or the :class:`PendingSnapshot` with ``async_take``.

        Raises:
            SnapshotExistsError: ``step`` already has a snapshot.
            InvalidArgumentError, ConfigError: a wrong argument (nothing was written).
            SnapshotkitError: the previous async save failed (its error; this save did not start),
                or this take failed, as :meth:`Snapshot.take` raises.
        """
        error: BaseException | None = None
        try:
            self._check_open()
            step = check_step(step)
            clean = clean_metrics(metrics)
            user_metadata = check_metadata(metadata)
            check_take_keywords(take_kwargs, incremental=self.incremental)
            validate_app_state(app_state)  # before the root is read for an incremental save's base
            if not isinstance(async_take, bool):
                raise ConfigError(f"async_take must be True or False, got {async_take!r}")
        except Exception as exc:
            error = exc
        # a wrong argument on one rank makes every rank raise here, before anything is written
        self._group.exchange(None, error, "SnapshotManager.save: checking the arguments")
        self._settle_pending()
        preemption = self._notices.agreed and not self._preemption_saved
        local = None
        if self._tier is not None and self._tier.wants(step):  # the local tier first: it is quick
            record = {MANAGER_KEY: {"step": step, "metrics": clean, "reason": "local"}}
            local = self._tier.save(step, app_state, metadata=record, async_take=async_take, take_kwargs=take_kwargs)
            if not (preemption or on_interval(step, self.save_interval_steps)):
                return local
        if step in self._steps:
            raise SnapshotExistsError(
                f"step {step} already has a snapshot at {self.snapshot_path(step)!r}; snapshotkit never overwrites "
                "one. Save a later step (should_save() is false for saved steps)"
            )
        reason = "preemption" if preemption else "interval" if on_interval(step, self.save_interval_steps) else "manual"
        user_metadata[MANAGER_KEY] = {"step": step, "metrics": clean, "reason": reason}
        if self.incremental:
            plan = self._plan_save()
            user_metadata[MANAGER_KEY].update(plan.record_members())
            if plan.base_step is not None:
                take_kwargs = {**take_kwargs, "base": self.snapshot_path(plan.base_step)}
        if async_take and self.async_executor is not None:
            take_kwargs.setdefault("executor", self.async_executor)
        path = self.snapshot_path(step)
        common: dict[str, Any] = {"pg": self.pg, "storage_options": self._options, "metadata": user_metadata}
        with _events.step_scope(step):
            if (tier := self._tier) and local is not None and async_take and not preemption and tier.can_promote(step):
                result: Snapshot | PendingSnapshot = tier.promote(step, path, app_state, self.pg, take_kwargs, common)
            elif async_take:
                result = Snapshot.async_take(path, app_state, **common, **take_kwargs)
            else:
                result = Snapshot.take(path, app_state, **common, **take_kwargs)
        self._steps.add(step)
        self._preemption_saved = self._preemption_saved or preemption
        if isinstance(result, PendingSnapshot):
            self._pending, self._pending_step, self._pending_for_preemption = result, step, preemption
        if self._group.rank == 0:
            pending = result if isinstance(result, PendingSnapshot) else None
            self._retention.submit(pending, StepRecord(step, clean))
        return result

    def wait(self) -> None:
        """Wait for the pending save (raising its failure) and the retention it started.

        With many ranks this is collective: every rank returns once rank 0's retention is done,
        so :meth:`steps` agrees on every rank afterwards.
        """
        error: BaseException | None = None
        try:
            self._settle_pending()
            if self._tier is not None:
                self._tier.wait()
            self._retention.wait()
        except Exception as exc:
            error = exc
        self._group.exchange(None, error, "SnapshotManager.wait: finishing saves and retention")

    def close(self) -> None:
        """:meth:`wait`, then stop the background work and put the previous signal handlers back.

        Collective like :meth:`wait`; idempotent. The manager is also a context manager that
        closes on exit (leaving on an exception, it only stops its own background work and does
        not wait for the other ranks).
        """
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._shut_down()

    def _shut_down(self, *, wait: bool = True) -> None:
        self._closed = True
        self._watcher.close()
        self._notices.close()
        if self._tier is not None:
            self._tier.close(wait=wait)
        self._retention.close(wait=wait)

    # ------------------------------------------------------------------ resuming

    def restore_latest(self, app_state: AppState, **restore_kwargs: Any) -> int | None:
        """Restore the newest snapshot that is complete and restores without error; return its step.

        Only committed snapshots are candidates (a take that never committed is not one). Newest
        first, a snapshot that is gone by the time it is read, or whose data or manifest is
        damaged (checksum, truncation, integrity), is skipped with a ``RuntimeWarning`` naming it
        and why, and the next older one is tried; every rank moves on together. Any other
        failure (a state that does not match, a store that cannot be reached) is raised: it
        would fail on every snapshot alike. After a fallback, a snapshot that lacks some of the
        state (``strict=False``) is refused with ``StateMismatchError``: the failed attempt may
        have left its data there. ``last_restore_report`` holds the restore's report.

        Damage is often found after some bytes were read into the objects: when nothing restored
        and an attempt, on any rank, may have written into the state, every rank raises
        ``PartialRestoreError`` (so ``restore_latest(...) or 0`` never trains on half-restored objects).

        Args:
            app_state: as for :meth:`Snapshot.restore` (checked first, before the root is read).
            restore_kwargs: passed to :meth:`Snapshot.restore` (``strict``, ``weights_only``...).

        Returns:
            The step restored, or None: nothing to resume from, and the state is untouched.

        Raises:
            InvalidAppStateError: ``app_state`` is not a dict of Stateful objects.
            PartialRestoreError: nothing restored, and an attempt may have changed the state.
            SnapshotkitError: any other failure, as :meth:`Snapshot.restore` raises it.
        """
        error: BaseException | None = None
        try:
            validate_app_state(app_state)
        except Exception as exc:
            error = exc
        # a wrong app_state on one rank makes every rank raise here, before anything is read
        self._group.exchange(None, error, "SnapshotManager.restore_latest: checking app_state")
        self._settle_pending()
        self._retention.settle()  # no deletion runs while older snapshots may be read
        committed: list[int] = []
        if self._group.rank == 0:
            try:
                committed = self._janitor.listing().committed
            except Exception as exc:
                error = exc
        candidates: list[int] = self._group.exchange(committed, error, "restore_latest: listing the root")[0]

        def open_step(step: int) -> Snapshot:
            return Snapshot(self.snapshot_path(step), pg=self.pg, storage_options=self._options)

        found = resume(self._group, self._tier, candidates, open_step, app_state, restore_kwargs)
        if self.async_executor is not None:  # the run starts here: warm the first async save up
            Snapshot.prepare_async(app_state, self.pg, executor=self.async_executor)
        if found is None:
            return None
        step, self.last_restore_report = found
        (self._steps if step in candidates else self._tier.saved).add(step)  # type: ignore[union-attr]
        return step

    def cleanup(self) -> list[int]:
        """Remove incomplete snapshots (takes that never committed, deletions cut short); rank 0 only.

        A step being written by this manager's pending save is left alone, and so is a directory
        holding anything a take does not write (it is reported at WARNING instead).

        Returns:
            The steps removed (none on other ranks).
        """
        return self._cleanup()[0] if self._group.rank == 0 else []

    def _cleanup(self) -> tuple[list[int], RootListing]:
        writing = self._pending_step if self._pending is not None and not self._pending.done() else None
        return self._janitor.cleanup(writing)

    # ------------------------------------------------------------------ helpers

    def _plan_save(self) -> SavePlan:
        """Rank 0 finds the newest committed snapshot (the previous save has committed by now);
        every rank takes against the same one."""
        head: tuple[int, int] | None = None
        error: BaseException | None = None
        if self._group.rank == 0:
            try:
                head = self._janitor.chain_head()
            except Exception as exc:
                error = exc
        head = self._group.exchange(head, error, "SnapshotManager.save: finding the base snapshot")[0]
        newest, since_full = head if head is not None else (None, 0)
        return plan_save(newest, since_full, self.full_every)

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"the SnapshotManager of {self.root!r} is closed; create a new one to save again")

    def _settle_pending(self) -> None:
        pending, step = self._pending, self._pending_step
        if pending is None:
            return
        self._pending = self._pending_step = None
        try:
            pending.wait()
        except BaseException:
            if step is not None:
                self._steps.discard(step)
            if self._pending_for_preemption:
                self._preemption_saved = False  # the notice still needs its save
            raise
