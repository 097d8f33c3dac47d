"""The two synchronisation points of a take's commit, and what each rank learns at them.

1. :meth:`Rendezvous.gather`: every rank contributes its result (or its error); rank 0 gets
   them all (:class:`Gathered`).
2. :meth:`Rendezvous.settle`: rank 0 publishes its :class:`Verdict` on the manifest
   (committed, aborted, or unknown); every other rank receives it.

Two implementations: :class:`CollectiveRendezvous` (collectives on the caller's thread, for
``take``) and :class:`StoreRendezvous` (the process group's store, usable from any thread, for
``async_take``'s background commit: no collective runs off the main thread).

IMPORTANT: a rank that contributed a success at ``gather`` has handed rank 0 the right to commit
a manifest referencing its data; from then on only an explicit ``ABORTED`` verdict (or a failure
every rank saw in the same exchange, :attr:`Gathered.shared`) tells it that its data may go. A
timeout tells it nothing (see :mod:`snapshotkit._take.commit`).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import pickle
from typing import Any, Protocol

from snapshotkit._dist import Group, RankOutcome, describe_error, portable
from snapshotkit.errors import CollectiveTimeoutError


class Outcome(enum.Enum):
    """What rank 0 knows of the manifest after the commit step."""

    #: The manifest is written: the snapshot exists, every rank keeps its data.
    COMMITTED = "committed"
    #: No manifest exists and none will be written: every rank may delete its data.
    ABORTED = "aborted"
    #: Rank 0 cannot tell whether the manifest was written: every rank keeps its data.
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Rank 0's word on the commit: the outcome, and the error behind it (if any).

    Attributes:
        outcome: committed, aborted or unknown.
        failing_rank: the rank whose failure caused an abort (0 when rank 0's own).
        error: that failure, when it survives pickling.
        error_text: one line naming the failure ("" when there was none).
    """

    outcome: Outcome
    failing_rank: int = 0
    error: BaseException | None = None
    error_text: str = ""

    @classmethod
    def of(cls, outcome: Outcome, error: BaseException | None = None, failing_rank: int = 0) -> Verdict:
        if error is None:
            return cls(outcome, failing_rank)
        return cls(outcome, failing_rank, portable(error), describe_error(error))


@dataclasses.dataclass(frozen=True)
class Gathered:
    """What one rank learned at :meth:`Rendezvous.gather`.

    Attributes:
        values: every rank's value, in rank order (rank 0; other ranks may get None).
        failed: the ranks that reported an error, with their outcome.
        shared: every rank saw the same ``failed`` in one exchange (collectives), so no verdict
            needs publishing for it: every rank knows the take is aborted.
    """

    values: list[Any] | None
    failed: list[tuple[int, RankOutcome]] = dataclasses.field(default_factory=list)
    shared: bool = False


class Rendezvous(Protocol):
    """The two synchronisation points of a commit (see the module docstring)."""

    @property
    def publishes_after_interrupt(self) -> bool:
        """Whether rank 0 may still publish a verdict after its :meth:`gather` raised (a store
        can; an interrupted collective would leave the ranks' sequences of collectives misaligned)."""
        ...

    def gather(self, value: Any, error: BaseException | None, what: str) -> Gathered:
        """Contribute this rank's ``value`` (or ``error``). Raises only when the exchange itself
        did not complete (a timeout, an interrupt, the store gone)."""
        ...

    def settle(self, verdict: Verdict | None, what: str) -> Verdict:
        """Rank 0 publishes ``verdict`` (and gets it back); other ranks pass None and receive it.

        Raises:
            CollectiveTimeoutError: rank 0's verdict did not arrive in time.
        """
        ...


@dataclasses.dataclass(frozen=True)
class CollectiveRendezvous:
    """A rendezvous through collectives (:meth:`Group.all_gather_object`) on the caller's thread."""

    group: Group
    publishes_after_interrupt: bool = False

    def gather(self, value: Any, error: BaseException | None, what: str) -> Gathered:
        if not self.group.distributed:
            failed = [] if error is None else [(0, RankOutcome(None, error, describe_error(error)))]
            return Gathered([value], failed, shared=True)
        mine = RankOutcome(value) if error is None else RankOutcome(None, portable(error), describe_error(error))
        outcomes: list[RankOutcome] = self.group.all_gather_object(mine, what)
        failed = [(rank, o) for rank, o in enumerate(outcomes) if o.error_text]
        return Gathered([o.value for o in outcomes], failed, shared=True)

    def settle(self, verdict: Verdict | None, what: str) -> Verdict:
        if not self.group.distributed:
            assert verdict is not None
            return verdict
        verdicts: list[Verdict | None] = self.group.all_gather_object(verdict, what)
        published = verdicts[0]
        assert published is not None  # rank 0 always contributes one
        return published


@dataclasses.dataclass(frozen=True)
class StoreRendezvous:
    """A rendezvous through the default process group's store, usable off the main thread.

    ``key`` names the take (its id and path) so concurrent takes never mix. Every key a commit
    sets is deleted once every rank has read it: rank 0 deletes the results it gathered (each
    other rank its own too, once the verdict came), and the last rank done with the verdict
    deletes it, so a run of any length leaves the store as it found it.
    """

    group: Group
    key: str
    publishes_after_interrupt: bool = True

    def _store(self) -> Any:
        return self.group.store()

    def _result_key(self, rank: int) -> str:
        return f"{self.key}/result/{rank}"

    def _wait(self, store: Any, keys: list[str], what: str, waiting_for: str) -> None:
        try:
            store.wait(keys, datetime.timedelta(seconds=self.group.timeout_seconds))
        except RuntimeError as exc:
            raise CollectiveTimeoutError(
                f"{what}: rank {self.group.rank} of {self.group.world_size} waited {self.group.timeout_seconds:g} s "
                f"for {waiting_for}. A rank crashed, hangs or is just slow; raise "
                "SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS if the ranks are just slow"
            ) from exc

    def _done_with_verdict(self, store: Any) -> None:
        """Count this rank as done with the verdict; the last of all ranks deletes it."""
        if store.add(f"{self.key}/done", 1) >= self.group.world_size:
            store.delete_key(f"{self.key}/verdict")
            store.delete_key(f"{self.key}/done")

    def gather(self, value: Any, error: BaseException | None, what: str) -> Gathered:
        store = self._store()
        mine = RankOutcome(value) if error is None else RankOutcome(None, portable(error), describe_error(error))
        store.set(self._result_key(self.group.rank), pickle.dumps(mine))
        if self.group.rank != 0:
            if error is not None:  # this rank will not wait for the verdict
                self._done_with_verdict(store)
            return Gathered(None)
        keys = [self._result_key(r) for r in range(self.group.world_size)]
        self._wait(store, keys, what, "the other ranks' writes to finish; nothing was committed")
        outcomes: list[RankOutcome] = [pickle.loads(store.get(k)) for k in keys]  # noqa: S301 - our ranks
        for key in keys:
            store.delete_key(key)
        failed = [(rank, o) for rank, o in enumerate(outcomes) if o.error_text]
        return Gathered([o.value for o in outcomes], failed)

    def settle(self, verdict: Verdict | None, what: str) -> Verdict:
        store = self._store()
        if self.group.rank == 0:
            assert verdict is not None
            store.set(f"{self.key}/verdict", pickle.dumps(verdict))
            self._done_with_verdict(store)
            return verdict
        self._wait(
            store,
            [f"{self.key}/verdict"],
            what,
            "rank 0 to commit the manifest; whether it did is unknown, so this rank's data was kept",
        )
        published: Verdict = pickle.loads(store.get(f"{self.key}/verdict"))  # noqa: S301 - our ranks
        store.delete_key(self._result_key(self.group.rank))  # rank 0 read it before publishing
        self._done_with_verdict(store)
        return published
