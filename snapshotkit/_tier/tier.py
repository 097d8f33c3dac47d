"""One rank's fast-recovery tier: its local saves, their replicas on peer nodes, their retention.

:class:`LocalTier` is what :class:`~snapshotkit.SnapshotManager` holds when it has a
``local_root``. A local save is a snapshot of this rank's state taken by this rank alone (a
process group of one: no collective, nothing waits for the other ranks) into its node's local
root (:mod:`.local`). Once it commits, a background thread sends it to the ``replicas`` ranks
:func:`~.nodes.replica_holders` picks on other nodes (:mod:`.transfer`), then applies the local
retention (the newest ``keep_last`` steps).

IMPORTANT: the replication thread is the one place where snapshotkit uses ``torch.distributed``
off the caller's thread, and it does so on a gloo group of its own (:attr:`LocalTier.copy_group`),
created collectively here and used by that one thread per rank only, in step order on every
rank, so its point-to-point transfers never interleave with the caller's collectives. Restores
(:mod:`.recover`) use the same group after draining the thread: from the caller's thread, or
from the tier's thread while the caller restores its own copy.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snapshotkit import _events
from snapshotkit._config import Config
from snapshotkit._dist import Group, own_process_group, resolve_group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._lifecycle.removal import remove_snapshot
from snapshotkit._take.collect import ddp_replicated_patterns
from snapshotkit._tier.local import LocalRoot, local_root_path
from snapshotkit._tier.nodes import NodeMap, node_id, replica_holders
from snapshotkit._tier.promote import PromotionJob, copy_state, verify_copy
from snapshotkit._tier.shards import TIER_KEY, own_shards
from snapshotkit._tier.transfer import Transfer, TransferOutcome, send_and_receive
from snapshotkit.errors import ConfigError, InvalidArgumentError
from snapshotkit.snapshot import PendingSnapshot, Snapshot
from snapshotkit.stateful import AppState

__all__ = ["LocalTier", "TierOptions", "check_tier_options"]

_log = logging.getLogger("snapshotkit.manager")


class LocalTier:
    """This rank's side of the local tier (module docstring). Construction is collective.

    Args:
        group: the manager's group.
        options: ``root`` (this node's local root), ``interval_steps`` (a local save at every
            multiple), ``keep_last`` (the newest this many local steps are kept, own copies and
            replicas alike), ``replicas`` (how many other nodes hold a copy of each local save).
    """

    def __init__(self, group: Group, options: TierOptions) -> None:
        self.group, self.interval_steps = group, options.interval_steps
        self.keep_last, self.replicas = options.keep_last, options.replicas
        self.promote_copies = options.promote
        error: BaseException | None = None
        node = ""
        try:
            node = node_id()
        except Exception as exc:
            error = exc
        self.nodes = NodeMap(tuple(group.exchange(node, error, "SnapshotManager: finding each rank's node")))
        self.holders = replica_holders(self.nodes, options.replicas)  # the same on every rank
        rank = group.rank
        self.held_for = tuple(owner for owner, holders in enumerate(self.holders) if rank in holders)
        self.root = LocalRoot(options.root, {rank, *self.held_for})
        self.own_pg = own_process_group()
        self.copy_group = group.new_gloo_group() if group.distributed else None
        self.last_outcomes: list[TransferOutcome] = []
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._background: list[concurrent.futures.Future[None]] = []
        self._error: BaseException | None = None
        self.root.cleanup()
        #: Steps this rank has (or is writing) a copy of its own for.
        self.saved = {step for step, owner in self.root.holdings() if owner == rank}
        self._called: set[int] = set()  # steps save() ran for in this process
        self._sharded: set[int] = set()  # steps whose copy holds sharded tensors as local shards (never promoted)
        #: The step restore_latest resumed from (any tier), or None: later copies not saved here are stale.
        self.resumed_at: int | None = None

    def __repr__(self) -> str:
        return f"LocalTier({str(self.root.root)!r}, every {self.interval_steps} steps, {self.replicas} replicas)"

    def due(self, step: int) -> bool:
        """Whether ``step`` is a local save step."""
        return step % self.interval_steps == 0

    def wants(self, step: int) -> bool:
        """Whether ``step`` is a local save step :meth:`save` has not run for yet in this process.

        The same on every rank (it depends on the step and the calls alone): a rank that already
        has a copy of that step (from before a restart) still takes part in its replication."""
        return self.due(step) and step not in self._called

    def copy_path(self, step: int, owner: int | None = None) -> Path:
        return self.root.copy_path(step, self.group.rank if owner is None else owner)

    def snapshot(self, step: int, owner: int | None = None) -> Snapshot:
        """The local copy of ``owner``'s (this rank's) state at ``step``, opened by this rank alone."""
        return Snapshot(str(self.copy_path(step, owner)), pg=self.own_pg)

    def discard(self, step: int) -> None:
        """Delete this rank's own copy of ``step`` (found damaged), manifest first."""
        path = self.copy_path(step)
        _log.warning("local tier: deleting the damaged copy %s", path)
        remove_snapshot(str(path), {})
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the step's directory, when no other copy is in it
        self.saved.discard(step)

    # ------------------------------------------------------------------ saving

    def save(
        self,
        step: int,
        app_state: AppState,
        *,
        metadata: Mapping[str, Any],
        async_take: bool,
        take_kwargs: Mapping[str, Any],
    ) -> Snapshot | PendingSnapshot:
        """Take this rank's local copy of ``step``; replication and retention follow in the
        background, after it committed. First, copies of an abandoned run are removed
        (:meth:`_remove_stale`): a copy of ``step`` itself from before is never kept, since the
        state at ``step`` need not be what it was then (another run, another resume point)."""
        self._remove_stale(step)
        self._called.add(step)
        path = str(self.copy_path(step))
        self.copy_path(step).parent.mkdir(parents=True, exist_ok=True)
        try:
            view = own_shards(app_state)  # a sharded tensor as this rank's own shard
            record = {**metadata, TIER_KEY: {"shards": view.layouts_json()}} if view.layouts else dict(metadata)
            if view.layouts:
                self._sharded.add(step)
            # a local copy is whole: the save's base= (a durable step) is the durable take's alone
            own = {k: v for k, v in take_kwargs.items() if k != "base"}
            common: dict[str, Any] = {"pg": self.own_pg, "metadata": record, **own}
            if async_take:
                result: Snapshot | PendingSnapshot = Snapshot.async_take(path, view.app_state, **common)
            else:
                result = Snapshot.take(path, view.app_state, **common)
        except BaseException:
            # the peers expect this step's transfers all the same: they learn there is no copy
            self._background.append(self._pool().submit(self._after_save, step, None))
            raise
        self.saved.add(step)
        pending = result if isinstance(result, PendingSnapshot) else None
        self._background.append(self._pool().submit(self._after_save, step, pending))
        return result

    def _remove_stale(self, step: int) -> None:
        """Delete the copies (own ones and replicas, committed or not) of steps that this process
        did not save and that are later than the step it resumed from (all of them, without a
        resume): they belong to a run abandoned at that point. Kept, they would be restored
        instead of this run's steps, promoted to the durable tier as this step, or outrank this
        run's copies in the local retention. Each rank removes its own; every rank saves ``step``."""
        newer_than = -1 if self.resumed_at is None else self.resumed_at
        stale = self.root.remove_steps(lambda s: s > newer_than and s not in self._called)
        if stale:
            _log.warning(
                "local tier: removed the copies of steps %s under %s, left by a run that did not continue from "
                "them (this run %s)",
                stale,
                self.root.root,
                "started afresh" if self.resumed_at is None else f"resumed from step {self.resumed_at}",
            )
            self.saved.difference_update(stale)

    def _after_save(self, step: int, pending: PendingSnapshot | None) -> None:
        """Background: wait for the copy to commit, replicate it, apply retention. A failure is
        logged and kept for :meth:`wait` (the first one); replication still runs, so that the
        peers, which cannot know of it, never wait for this rank."""
        if pending is not None:
            try:
                pending.wait()
            except BaseException as exc:
                self.saved.discard(step)
                self._keep(f"the local save of step {step}", exc)
        try:
            if self.copy_group is not None and self.replicas:
                transfers = [
                    Transfer(step, owner, owner, holder)
                    for owner, holders in enumerate(self.holders)
                    for holder in holders
                ]
                self.last_outcomes = self.exchange_copies(transfers)
                for outcome in self.last_outcomes:
                    if not outcome.ok and outcome.transfer.receiver == self.group.rank:
                        _log.warning(
                            "local tier: rank %d's copy of step %d did not arrive here: %s",
                            outcome.transfer.owner,
                            step,
                            outcome.reason,
                        )
            self.root.retain(self.keep_last)
        except BaseException as exc:
            self._keep(f"replicating the local save of step {step}", exc)

    def can_promote(self, step: int) -> bool:
        """Whether the durable save of ``step``, which :meth:`save` just took a local copy of, can
        be promoted from the copies: on every rank, the option is on and the copy holds no
        sharded tensor (a collective on the caller's thread)."""
        mine = self.promote_copies and step not in self._sharded
        return all(self.group.exchange(mine, None, "SnapshotManager.save: can every rank promote its local copy"))

    def promote(
        self,
        step: int,
        path: str,
        app_state: AppState,
        pg: Any,
        take_kwargs: Mapping[str, Any],
        common: Mapping[str, Any],
    ) -> PendingSnapshot:
        """Take the durable snapshot ``path`` of ``step`` from this rank's local copy, on the tier's
        thread once the copy is replicated (:mod:`.promote`). Every rank calls it for the same step;
        ``take_kwargs`` and ``common`` are the durable take's (``base``, ``replicated``,
        ``metadata``, ``storage_options``...; ``pg`` and ``executor`` are not used: the take runs
        on the tier's own group and thread; nor is ``_custom_tensor_prepare_func``, whose results
        the copy holds). ``pg`` is the manager's, for the snapshot returned. ``app_state`` is the
        live state: a ``DistributedDataParallel`` module's state is replicated, as a take of it
        infers (the copy's rebuilt state has no module to infer it from)."""
        # the copy already holds what _custom_tensor_prepare_func made of each tensor: not applied twice
        dropped = ("pg", "executor", "_custom_tensor_prepare_func")
        kwargs = {k: v for k, v in {**take_kwargs, **common}.items() if k not in dropped}
        ddp = ddp_replicated_patterns(app_state)
        if ddp:
            kwargs["replicated"] = [*(kwargs.get("replicated") or ()), *ddp]
        future = self._pool().submit(self._promote, step, path, kwargs)
        snapshot = Snapshot(path, pg=pg, storage_options=dict(common.get("storage_options") or {}))
        return PendingSnapshot(PromotionJob(path, future), pg, lambda _: snapshot)  # it reads its manifest when asked

    def _promote(self, step: int, path: str, take_kwargs: dict[str, Any]) -> SnapshotMetadata | None:
        pg = self.copy_group if self.copy_group is not None else self.group.pg
        state: dict[str, Any] = {}
        error: BaseException | None = None
        try:
            verify_copy(self.copy_path(step))
            state = copy_state(self.snapshot(step), self.copy_path(step))
        except Exception as exc:
            error = exc
        timeout_s = Config.resolve().collective_timeout_seconds
        resolve_group(pg, timeout_seconds=timeout_s).exchange(
            None, error, f"promoting step {step} from the local tier", "nothing was written to the durable tier"
        )
        with _events.step_scope(step):
            snapshot = Snapshot.take(path, state, pg=pg, **take_kwargs)
        _log.info("local tier: step %d promoted to %s", step, path)
        return snapshot.metadata if self.group.rank == 0 else None

    def exchange_copies(self, transfers: list[Transfer]) -> list[TransferOutcome]:
        """Run ``transfers`` between the ranks' local roots over :attr:`copy_group` (every rank
        calls it with the same list)."""
        timeout_s = Config.resolve().collective_timeout_seconds
        return send_and_receive(
            self.copy_group,
            self.group.rank,
            transfers,
            # each rank reads (as sender) or writes (as receiver) only its own node's local root
            lambda t: self.root.copy_path(t.step, t.owner),
            lambda t: self.root.copy_path(t.step, t.owner),
            timeout_s=timeout_s,
        )

    def exchange_copies_in_background(
        self, transfers: list[Transfer]
    ) -> concurrent.futures.Future[list[TransferOutcome]]:
        """:meth:`exchange_copies` on the tier's thread (drained first: the copies go in list order
        there too), for the caller's thread to restore meanwhile."""
        self.drain()
        future = self._pool().submit(self.exchange_copies, transfers)
        return future

    # ------------------------------------------------------------------ background work

    def wait(self) -> None:
        """Wait for the background replication and retention; raise the first failure it kept."""
        self.drain()
        failed, self._error = self._error, None
        if failed is not None:
            raise failed

    def drain(self) -> None:
        """Wait for the background work without raising what it kept (it stays for :meth:`wait`)."""
        background, self._background = self._background, []
        for future in background:
            future.result()

    def close(self, *, wait: bool = True) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=wait, cancel_futures=not wait)

    def _keep(self, what: str, exc: BaseException) -> None:
        _log.warning("local tier: %s failed: %s", what, exc, exc_info=exc)
        if self._error is None:
            self._error = exc

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshotkit-local-tier")
        return self._worker


@dataclasses.dataclass(frozen=True)
class TierOptions:
    """The local tier's arguments of :class:`~snapshotkit.SnapshotManager`, checked."""

    root: Path
    interval_steps: int
    keep_last: int
    replicas: int
    promote: bool = True


def check_tier_options(
    local_root: object, interval_steps: object, keep_last: object, replicas: object, promote: object = True
) -> TierOptions | None:
    """The local tier's options, or None without a ``local_root``; raised before anything runs.

    Raises:
        ConfigError: ``local_root`` is not a local directory, or tier options without it.
        InvalidArgumentError: a count of the wrong type or range.
    """
    if local_root is None:
        given = [n for n, v in (("local_interval_steps", interval_steps), ("local_replicas", replicas)) if v]
        if given:
            raise ConfigError(f"{' and '.join(given)} need local_root= (this node's directory for the local tier)")
        return None
    root = local_root_path(local_root)
    if interval_steps is None:
        raise ConfigError("local_root= needs local_interval_steps= (a local save every this many steps)")
    for name, value, low in (
        ("local_interval_steps", interval_steps, 1),
        ("local_keep_last", keep_last, 1),
        ("local_replicas", replicas, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
    if not isinstance(promote, bool):
        raise InvalidArgumentError(f"local_promote must be True or False, got {promote!r}")
    return TierOptions(root, int(interval_steps), int(keep_last), int(replicas), promote)  # type: ignore[call-overload]
