"""``restore_latest`` with a local tier: one step for every rank, each served by the nearest intact copy.

1. Every rank lists the committed copies in its node's local root (its own, and the replicas it
   holds); rank 0 lists the durable root. One exchange gives every rank all of it.
2. :func:`~.agreement.decide` picks the newest step every rank can restore and, per rank, the
   copy: its own, else a peer's replica, else (for every rank at once) the durable tier.
3. Peers send the replicas to the ranks that need them, over the tier's copy group; a copy is
   verified on arrival (every checksum) and lands in the receiver's local root, so a replaced
   node's local tier is filled again.
4. Every rank restores its copy alone. A copy that turns out damaged (checksum, truncation,
   integrity) is excluded and the ranks decide again together; any other failure is raised.

A durable decision hands over to the manager's restore of the durable tier
(:func:`~snapshotkit._lifecycle.fallback.restore_newest`, which walks back through older durable
steps on damage).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from snapshotkit import _events
from snapshotkit._dist import Group
from snapshotkit._lifecycle.fallback import Attempt, partial_restore, reason, restore_newest, verdict
from snapshotkit._restore.partial import RestoreReport
from snapshotkit._runtime.touched import state_touched
from snapshotkit._tier.agreement import Decision, Holdings, Source, decide, describe
from snapshotkit._tier.shards import check_layouts, check_optimizers, own_shards
from snapshotkit._tier.tier import LocalTier
from snapshotkit._tier.transfer import Transfer

__all__ = ["TierRestore", "restore_from_tiers", "resume"]

_log = logging.getLogger("snapshotkit.manager")


@dataclasses.dataclass(frozen=True)
class TierRestore:
    """What :func:`restore_from_tiers` restored.

    Attributes:
        step: the step every rank restored.
        source: this rank's source: ``"local"`` (its own copy), ``"peer"`` (a replica a peer
            sent) or ``"durable"``.
        sources: every rank's source, in rank order.
        report: this rank's restore report.
    """

    step: int
    source: str
    sources: tuple[str, ...]
    report: RestoreReport


def resume(
    group: Group,
    tier: LocalTier | None,
    durable_steps: Sequence[int],
    open_step: Callable[[int], Any],
    app_state: Any,
    restore_kwargs: Mapping[str, Any],
) -> tuple[int, RestoreReport] | None:
    """``SnapshotManager.restore_latest`` after the listing: the step restored and this rank's
    report (its ``source`` set with a local tier), or None. ``open_step(step)`` opens a durable
    step's :class:`~snapshotkit.Snapshot`. Collective."""

    def restore_durable(candidates: Sequence[int]) -> tuple[int, RestoreReport] | None:
        return restore_newest(group, candidates, open_step, app_state, restore_kwargs)

    if tier is None:
        return restore_durable(durable_steps)
    restored = restore_from_tiers(group, tier, durable_steps, app_state, restore_kwargs, restore_durable)
    if restored is None:
        return None
    tier.resumed_at = restored.step  # local copies of later steps are of a run abandoned here
    return restored.step, dataclasses.replace(restored.report, source=restored.source)


def restore_from_tiers(
    group: Group,
    tier: LocalTier,
    durable_steps: Sequence[int],
    app_state: Any,
    restore_kwargs: Mapping[str, Any],
    restore_durable: Callable[[Sequence[int]], tuple[int, RestoreReport] | None],
) -> TierRestore | None:
    """Restore the newest step some tier serves to every rank (module docstring). Collective.

    ``restore_durable(candidates)`` restores the newest of the durable ``candidates`` that
    restores (collectively, as the manager does without a local tier).

    Returns:
        What was restored, or None: no tier holds a step (nothing restored, the state untouched).

    Raises:
        PartialRestoreError: no copy restored and an attempt may have written into the state.
        SnapshotkitError: a failure that is not damage to a copy, as the restore raised it.
    """
    tier.drain()  # no replication or retention runs while copies are listed and read
    holdings = group.exchange(tier.root.holdings(), None, "restore_latest: listing the local tier")
    everyone = [Holdings(frozenset(h)) for h in holdings]
    excluded: set[tuple[int, int, int]] = set()
    tried: list[Attempt] = []
    while True:
        decision = decide(everyone, durable_steps, excluded=frozenset(excluded))
        if decision is None or decision.tier == "durable":
            newest = decision.step if decision is not None else None
            candidates = [s for s in durable_steps if newest is None or s <= newest]
            if not candidates:
                if any(attempt.touched for attempt in tried):
                    raise partial_restore(tried)
                return None
            found = restore_durable(candidates)
            if found is None:
                return None
            step, report = found
            _log.info("restore_latest: step %d from the durable tier on every rank", step)
            return TierRestore(step, Source.DURABLE.value, (Source.DURABLE.value,) * group.world_size, report)
        _log.info("restore_latest: %s", describe(decision))
        result = _restore_local(group, tier, decision, app_state, restore_kwargs, excluded, tried)
        if result is not None:
            return result


def _restore_local(
    group: Group,
    tier: LocalTier,
    decision: Decision,
    app_state: Any,
    restore_kwargs: Mapping[str, Any],
    excluded: set[tuple[int, int, int]],
    tried: list[Attempt],
) -> TierRestore | None:
    """Fetch the peers' copies ``decision`` needs, then restore this rank's; None when a copy
    was damaged on some rank (``excluded`` and ``tried`` grow: decide again).

    A rank that restores its own copy does so while the peers' copies travel (the tier's thread
    sends and receives them on its own group): the fetches are mostly I/O and the network, and
    the ranks waiting for a copy restore only once it has arrived intact. Should a copy fail to
    arrive, those early restores count as an attempt that wrote into the state."""
    step, rank = decision.step, group.rank
    source = decision.sources[rank]
    fetches = [
        Transfer(step, owner, peer.holder, owner)
        for owner, peer in enumerate(decision.sources)
        if peer.source == Source.PEER and peer.holder is not None
    ]
    early: tuple[RestoreReport | None, BaseException | None] | None = None
    if fetches and source.source == Source.LOCAL:
        travelling = tier.exchange_copies_in_background(fetches)
        try:
            early = _restore_copy(tier, step, app_state, restore_kwargs)
        finally:
            outcomes = travelling.result()
    else:
        outcomes = tier.exchange_copies(fetches) if fetches else []
    # a copy of this rank's own that arrived is this rank's copy of that step from now on (also when
    # another rank's fetch failed and an older step is restored: a later save of this step keeps it)
    tier.saved.update(o.transfer.step for o in outcomes if o.ok and o.transfer.receiver == o.transfer.owner == rank)
    failed_fetches = [o.transfer for o in outcomes if not o.ok and o.transfer.receiver == rank]
    wrote = early is not None and (early[1] is None or state_touched(early[1]))
    bad = group.exchange(
        ([(t.step, t.owner, t.sender) for t in failed_fetches], wrote), None, "restore_latest: fetching copies"
    )
    if any(copies for copies, _ in bad):
        for copies, _ in bad:
            excluded.update(tuple(c) for c in copies)
        why = "a peer's copy did not arrive intact"
        touched = any(w for _, w in bad)
        attempts = max(len(failed_fetches), 1 if touched else 0)  # every rank knows the state was written
        tried.extend(Attempt(step, str(tier.copy_path(step)), why, touched) for _ in range(attempts))
        return None
    report, error = early if early is not None else _restore_copy(tier, step, app_state, restore_kwargs)
    mine = (verdict(error), state_touched(error)) if error is not None else ("ok", False)
    # a failure that is not damage (a state that does not match...) would fail on every copy alike:
    # the failing rank raises it, the others a RankFailedError naming it
    fatal = error if error is not None and mine[0] == "raise" else None
    verdicts = group.exchange(mine, fatal, "restore_latest: restoring from the local tier")
    damaged = [r for r, (v, _) in enumerate(verdicts) if v != "ok"]
    if rank in damaged:  # never used again: a peer's intact copy may take its place
        tier.discard(step)
    if damaged:
        for r in damaged:
            holder = decision.sources[r].holder
            excluded.add((step, r, r))
            if holder is not None:
                excluded.add((step, r, holder))
        touched = any(t for _, t in verdicts)
        why = reason(error) if error is not None else f"rank {damaged[0]}'s copy is damaged"
        tried.append(Attempt(step, str(tier.copy_path(step)), why, touched))
        if error is not None:
            warnings.warn(
                f"restore_latest: not using the local copy of step {step} at {str(tier.copy_path(step))!r}: "
                f"{reason(error)}; trying the next intact copy",
                RuntimeWarning,
                stacklevel=4,
            )
        return None
    assert report is not None
    sources = tuple(s.source.value for s in decision.sources)
    return TierRestore(step, source.source.value, sources, report)


def _restore_copy(
    tier: LocalTier, step: int, app_state: Any, restore_kwargs: Mapping[str, Any]
) -> tuple[RestoreReport | None, BaseException | None]:
    """Restore this rank's local copy of ``step``: the report, or the error it raised."""
    try:
        with _events.step_scope(step):
            copy = tier.snapshot(step)
            # as the copy was taken: sharded tensors as their local shards
            strict, metadata = restore_kwargs.get("strict", True) is not False, copy.metadata
            view = own_shards(app_state, strict=strict, copy=metadata)
            check_layouts(metadata.user_metadata, view, str(tier.copy_path(step)))
            check_optimizers(metadata, view)
            return copy.restore(view.app_state, **restore_kwargs), None
    except Exception as exc:
        return None, exc
