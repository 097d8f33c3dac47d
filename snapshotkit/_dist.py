"""The process-group facade: rank, world size, and the few collectives a take or restore needs.

torch.distributed is the engine: every exchange here is a ``torch.distributed`` collective on
the caller's process group. What this module adds is what checkpointing needs on top:

* every collective has a timeout (``Work.wait(timeout)``) and a timeout raises
  :class:`~snapshotkit.errors.CollectiveTimeoutError` naming the step, never an endless wait;
* :meth:`Group.exchange` is the one primitive a take or restore is built from: each rank
  contributes its result *or its error*, and every rank gets every rank's, so one failing rank
  makes all of them raise at the same step instead of leaving the others waiting.

* :meth:`Group.any_through_store` agrees on a flag through the process group's store instead
  (no collective, no device sync: cheap enough to run between training steps);
* :func:`rank_failed` is the error a rank raises for another rank's failure (the take's commit
  rendezvous, :mod:`snapshotkit._take.rendezvous`, uses it too).

Without an initialized ``torch.distributed`` (or with a group of one rank) everything is local.
"""

from __future__ import annotations

import dataclasses
import datetime
import pickle
import traceback
from collections.abc import Sequence
from typing import Any

from snapshotkit.errors import CollectiveTimeoutError, ConfigError, RankFailedError, SnapshotkitError


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """What one rank reports at an exchange: a value, or the error it hit."""

    value: Any = None
    error: BaseException | None = None
    error_text: str = ""


def portable(error: BaseException) -> BaseException | None:
    """``error`` if it survives pickling (most exceptions do), else None."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    except Exception:
        return None
    return error


@dataclasses.dataclass
class Group:
    """This process's place in the group a snapshot is taken or restored by.

    Attributes:
        rank: this process's rank within ``pg``.
        world_size: ranks in ``pg``.
        pg: the ``torch.distributed`` process group (None: the default group, or no group).
        timeout_seconds: how long each collective waits for the other ranks.
    """

    rank: int
    world_size: int
    pg: Any = None
    timeout_seconds: float = 1800.0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------ primitives

    def _device(self) -> Any:
        import torch
        import torch.distributed as dist

        if dist.get_backend(self.pg) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _wait(self, work: Any, what: str) -> None:
        """Wait for a collective: a timeout is a :class:`CollectiveTimeoutError`, a connection to
        a rank lost (gloo: "Connection reset/closed by peer") a :class:`RankFailedError`, never
        torch's ``RuntimeError``."""
        self.collectives += 1
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_seconds))
        except RuntimeError as exc:
            if _timed_out(exc):
                raise self._timeout_error(what) from exc
            raise self._peer_lost(exc, what) from exc

    def _timeout_error(self, what: str) -> CollectiveTimeoutError:
        """The error of a collective or store round the other ranks did not reach in time."""
        return CollectiveTimeoutError(
            f"{what}: rank {self.rank} of {self.world_size} waited {self.timeout_seconds:g} s for the other "
            "ranks, which did not arrive. A rank crashed, hangs, or did not call the same snapshotkit "
            "operation; every rank must call it. Raise SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS if the ranks "
            "are just slow"
        )

    def all_gather_object(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order; ``what`` names the step in errors."""
        if not self.distributed:
            return [obj]
        import torch
        import torch.distributed as dist

        device = self._device()
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world_size)]
        self._wait(dist.all_gather(sizes, size, group=self.pg, async_op=True), what)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8, device=device)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        gathered = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(self.world_size)]
        self._wait(dist.all_gather(gathered, mine, group=self.pg, async_op=True), what)
        return [
            pickle.loads(t[: int(n.item())].cpu().numpy().tobytes())  # noqa: S301 - our own ranks' messages
            for t, n in zip(gathered, sizes, strict=True)
        ]

    def any(self, flag: bool, what: str) -> bool:
        """Whether ``flag`` is true on any rank: one all-reduce of one integer (cheap per step)."""
        if not self.distributed:
            return flag
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(bool(flag))], dtype=torch.int32, device=self._device())
        self._wait(dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.pg, async_op=True), what)
        return bool(value.item())

    def broadcasts_cpu(self) -> bool:
        """Whether this group's collectives carry CPU tensors (gloo), as :meth:`broadcast_into` needs."""
        import torch.distributed as dist

        return self.distributed and dist.get_backend(self.pg) == "gloo"

    def broadcast_into(self, buffers: Sequence[tuple[memoryview, int]], what: str) -> None:
        """Fill each writable ``(buffer, source rank)`` with that rank's bytes, in order, on every rank.

        Every rank must pass buffers of the same sizes and sources in the same order (CPU memory;
        see :meth:`broadcasts_cpu`). All are started, then awaited, so gloo pipelines them.
        """
        import torch
        import torch.distributed as dist

        tensors = [torch.frombuffer(buffer, dtype=torch.uint8) for buffer, _ in buffers]
        works = [
            dist.broadcast(tensor, group_src=src, group=self.pg, async_op=True)
            for tensor, (_, src) in zip(tensors, buffers, strict=True)
        ]
        for work in works:
            self._wait(work, what)

    def identity(self) -> tuple[object, ...]:
        """Names this group within this process (its members' global ranks, this rank, its size):
        equal for two ``Group`` values of one process group."""
        if self.pg is None:
            return ("default", self.rank, self.world_size)
        import torch.distributed as dist

        return (tuple(dist.get_process_group_ranks(self.pg)), self.rank, self.world_size)

    def store(self) -> Any:
        """The default process group's key-value store (usable from any thread, unlike collectives)."""
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()

    def all_reduce_min(self, values: list[int], what: str) -> list[int]:
        """The element-wise minimum over the ranks of ``values`` (int64 each): one all-reduce of
        ``8 * len(values)`` bytes, whatever the world size."""
        if not self.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64, device=self._device())
        self._wait(dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.pg, async_op=True), what)
        return [int(v) for v in tensor.tolist()]

    # ------------------------------------------------------------------ the first take's exchange
    # (snapshotkit/_take/exchange.py: a fixed-size header from every rank, then each distinct
    # description once, from the lowest rank holding it)

    def new_gloo_group(self) -> Any:
        """A new gloo process group over this group's ranks, for one purpose alone (the local
        tier's copies). Every rank of this group must call it, in the same order as any other
        group creation."""
        import torch.distributed as dist

        return dist.new_group(self.member_ranks(), backend="gloo", use_local_synchronization=True)

    def member_ranks(self) -> list[int]:
        """The global rank of each rank of this group, in group order (a DTensor's mesh names global ranks)."""
        if self.pg is None:
            return list(range(self.world_size))
        import torch.distributed as dist

        return [int(r) for r in dist.get_process_group_ranks(self.pg)]

    def all_gather_int64(self, values: Sequence[int], what: str) -> list[list[int]]:
        """Every rank's ``values`` (the same count of int64 on every rank), in rank order: one
        all-gather of ``8 * len(values)`` bytes from each rank."""
        if not self.distributed:
            return [list(values)]
        import torch
        import torch.distributed as dist

        device = self._device()
        mine = torch.tensor(list(values), dtype=torch.int64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._wait_for_peers(dist.all_gather(gathered, mine, group=self.pg, async_op=True), what)
        return [t.tolist() for t in gathered]

    def broadcast_bytes(self, data: bytes | None, nbytes: int, source: int, what: str) -> bytes:
        """Rank ``source``'s ``data`` (``nbytes`` long; other ranks pass None), on every rank."""
        if not self.distributed:
            assert data is not None
            return data
        import torch
        import torch.distributed as dist

        buffer = torch.empty(nbytes, dtype=torch.uint8)
        if self.rank == source:
            assert data is not None
            assert len(data) == nbytes
            if nbytes:
                buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        tensor = buffer.to(self._device())
        self._wait_for_peers(dist.broadcast(tensor, group_src=source, group=self.pg, async_op=True), what)
        return bytes(tensor.cpu().numpy().tobytes()) if self.rank != source else bytes(data or b"")

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's ``data`` (:meth:`all_gather_object`, a lost rank reported as one)."""
        try:
            return self.all_gather_object(data, what)
        except SnapshotkitError:
            raise
        except RuntimeError as exc:
            raise self._peer_lost(exc, what) from exc

    def _wait_for_peers(self, work: Any, what: str) -> None:
        """:meth:`_wait` (which raises a lost rank as a :class:`RankFailedError`)."""
        self._wait(work, what)

    def _peer_lost(self, exc: BaseException, what: str) -> RankFailedError:
        return RankFailedError(
            f"{what}: rank {self.rank} of {self.world_size} lost another rank in the middle of the exchange "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); a rank crashed or was killed, and this "
            "rank stopped too (a take commits nothing). Run it again once every rank runs"
        )

    # ------------------------------------------------------------------ point to point
    # (the fast-recovery tier's copies, snapshotkit/_tier/transfer.py: one sender, one receiver)

    def send_to(self, tensor: Any, peer: int, what: str) -> None:
        """Send the CPU ``tensor`` to rank ``peer`` of this group (gloo), which must receive it
        with :meth:`receive_from`; wait at most ``timeout_seconds`` for that.

        Raises:
            CollectiveTimeoutError: ``peer`` did not take it in time (``what`` names the step).
            RankFailedError: the connection to ``peer`` was lost (it crashed or was killed).
        """
        import torch.distributed as dist

        self._wait_for_peer(dist.isend(tensor, group=self.pg, group_dst=peer), peer, what)

    def receive_from(self, tensor: Any, peer: int, what: str) -> None:
        """Fill the CPU ``tensor`` with what rank ``peer`` of this group sends with :meth:`send_to`;
        wait at most ``timeout_seconds`` for it.

        Raises:
            CollectiveTimeoutError: ``peer`` sent nothing in time (``what`` names the step).
            RankFailedError: the connection to ``peer`` was lost (it crashed or was killed).
        """
        import torch.distributed as dist

        self._wait_for_peer(dist.irecv(tensor, group=self.pg, group_src=peer), peer, what)

    def _wait_for_peer(self, work: Any, peer: int, what: str) -> None:
        self.collectives += 1
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_seconds))
        except RuntimeError as exc:
            if _timed_out(exc):
                raise CollectiveTimeoutError(
                    f"{what}: rank {self.rank} of {self.world_size} waited {self.timeout_seconds:g} s for rank "
                    f"{peer}, which did not answer. It crashed, hangs, or did not call the same snapshotkit "
                    "operation with the same arguments; every rank must. Raise the timeout if it is just slow"
                ) from exc
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RankFailedError(
                f"{what}: rank {self.rank} of {self.world_size} lost rank {peer} in the middle of the exchange "
                f"({first_line}); it crashed or was killed. Go on once every rank runs again",
                peer,
            ) from exc

    # ------------------------------------------------------------------ the exchange

    def exchange(self, value: Any, error: BaseException | None, what: str, consequence: str = "") -> list[Any]:
        """Contribute ``value`` (or the ``error`` this rank hit) and get every rank's value.

        If any rank reported an error, every rank raises: the failing rank re-raises its own
        error, the others a :class:`RankFailedError` naming that rank, with its error (when it
        can be sent) as the cause, and ``consequence`` (such as "nothing was written") at the end
        of its message.
        """
        if not self.distributed:
            if error is not None:
                raise error
            return [value]
        outcome = RankOutcome(value) if error is None else RankOutcome(None, portable(error), describe_error(error))
        outcomes: list[RankOutcome] = self.all_gather_object(outcome, what)
        failed = [(rank, o) for rank, o in enumerate(outcomes) if o.error_text]
        if not failed:
            return [o.value for o in outcomes]
        if error is not None:
            raise error
        raise rank_failed(what, failed, consequence)

    # ------------------------------------------------------------------ agreeing through the store
    # (SnapshotManager.should_save's preemption notices: no collective, no device sync)

    #: Collectives this ``Group`` waited on (one per ``Work``), for tests and benchmarks.
    collectives: int = dataclasses.field(default=0, compare=False, repr=False)
    #: Rounds of :meth:`any_through_store` this ``Group`` took part in, for tests and benchmarks.
    store_rounds: int = dataclasses.field(default=0, compare=False, repr=False)

    def store_connection(self) -> Any:
        """A connection of its own to the default store (``Store.clone()``), so that the caller's
        operations never mix with another thread's on the shared connection (one TCPStore
        connection is not safe for two threads at once), such as the store waits of an
        ``async_take``'s background commit; the shared one where the store cannot be cloned."""
        store = self.store()
        try:
            return store.clone()
        except (AttributeError, NotImplementedError, RuntimeError):
            return store

    def any_through_store(self, flag: bool, key: str, what: str, store: Any | None = None) -> bool:
        """Whether ``flag`` is true on any rank, agreed through the store rather than a collective.

        Every rank must call it with the same ``key`` (unique to the round: it must never be
        reused). Each rank adds ``1 + (world_size + 1) * flag`` to ``<key>/count`` in one
        operation, so the count says both how many ranks arrived (modulo ``world_size + 1``) and
        how many of them had the flag set (the quotient); the rank that completes the arrivals
        publishes the answer as ``<key>/any``, which every rank waits for (at most
        ``timeout_seconds``). The last rank done deletes the round's keys. Four store operations
        per rank (two more for the last to arrive, three deletions for the last done), whatever
        the world size.

        Raises:
            CollectiveTimeoutError: the other ranks did not arrive in time (``what`` names the step).
            RankFailedError: the store could not be reached (the rank serving it may have exited).
        """
        if not self.distributed:
            return flag
        store = self.store() if store is None else store
        self.store_rounds += 1
        timeout = datetime.timedelta(seconds=self.timeout_seconds)
        try:
            count = store.add(f"{key}/count", 1 + (self.world_size + 1) * int(bool(flag)))
            if count % (self.world_size + 1) == self.world_size:  # this rank completed the arrivals
                store.set(f"{key}/any", b"1" if count // (self.world_size + 1) else b"0")
            store.wait([f"{key}/any"], timeout)
            answer = bool(store.get(f"{key}/any") == b"1")
            if store.add(f"{key}/done", 1) == self.world_size:  # every rank has read the answer
                for name in ("count", "any", "done"):
                    store.delete_key(f"{key}/{name}")
        except RuntimeError as exc:
            if _timed_out(exc):
                raise self._timeout_error(what) from exc
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RankFailedError(
                f"{what}: rank {self.rank} of {self.world_size} lost the process group's store ({first_line}); "
                "the rank serving it (global rank 0) has most likely exited. Look for the first rank that failed"
            ) from exc
        return answer


def resolve_group(pg: Any | None, *, timeout_seconds: float = 1800.0) -> Group:
    """The rank and world size of ``pg`` (the default group when ``None``).

    Without an initialized ``torch.distributed`` everything is world size 1.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if pg is not None:
            raise ConfigError("pg was given but torch.distributed is not initialized; call init_process_group() first")
        return Group(0, 1, None, timeout_seconds)
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ConfigError(
            "this process is not a member of the process group passed as pg; call Snapshot.take/restore only on "
            "the ranks of that group"
        )
    return Group(rank, dist.get_world_size(pg), pg, timeout_seconds)


def describe_error(error: BaseException) -> str:
    """One line naming an error, for the other ranks' messages."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


def rank_failed(what: str, failed: list[tuple[int, RankOutcome]], consequence: str = "") -> RankFailedError:
    """The error for another rank's failure at step ``what``; ``consequence`` (such as "nothing was
    committed") is added where it holds."""
    rank, first = failed[0]
    others = f" (and ranks {[r for r, _ in failed[1:]]})" if len(failed) > 1 else ""
    then = f", and {consequence}" if consequence else ""
    error = RankFailedError(
        f"{what}: rank {rank}{others} failed with {first.error_text}; this rank stopped too{then}", rank
    )
    error.__cause__ = first.error
    return error


def own_process_group() -> Any | None:
    """A new process group of this process alone when ``torch.distributed`` runs several ranks,
    else None (no group needed). Only this process calls it (``use_local_synchronization``): the
    way for one rank to take or read a snapshot while the others are elsewhere, as Lightning's
    global rank 0 saves its checkpoints alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group([dist.get_rank()], backend="gloo", use_local_synchronization=True)


def _timed_out(exc: BaseException) -> bool:
    """Whether a c10d error says a wait timed out (torch words it "timed out" or "timeout")."""
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text
