"""Replicated reads, once per group: one rank reads each piece every rank wants, the rest receive it.

Without this, N ranks restoring a replicated state each read all of it from storage (N x the
bytes; on an object store N x the requests and egress). With it (the default on gloo groups,
unless every rank is on one host reading a file system through its page cache, which reads
each byte once anyway; ``SNAPSHOTKIT_SHARE_REPLICATED_READS=1`` always shares, ``=0`` never,
for storage faster than the network):

1. *Agree.* Every rank offers whether it shares and a digest of the pieces of replicated and
   sharded entries it wants (one small all-gather, through :meth:`Group.exchange`, so a rank
   that failed before this point makes every rank raise here). Equal digests: those pieces are
   shared. Different ones: the lists are exchanged and only the pieces every rank wants are
   shared; everything else each rank reads itself, as without sharing.
2. *Own.* The agreed pieces, sorted by where they are stored, are cut into ``world_size``
   contiguous runs of about equal bytes: an owner's pieces stay adjacent in their data
   objects, so its merged ranged reads read no other owner's bytes.
3. *Rounds.* Each owner's run is cut into chunks of at most ``budget / 2 / world_size`` bytes
   (a larger piece is a chunk alone); round k is every owner's k-th chunk. Owners read their
   chunk (merged and verified like any read), every rank *settles* the round (one all-gather
   of outcomes: a failed read makes every rank raise an error of its class, naming the logical
   path, before anyone waits in a broadcast), then each piece is broadcast from its owner:
   pieces of at least :data:`_OWN_BROADCAST_BYTES` on their own, straight into a contiguous
   CPU destination where the rank has one (in sub-ranges of at most a chunk), smaller ones
   packed per owner into one broadcast. Receivers verify the checksum of what they received
   before handing it to a consumer or copying it to another destination.

IMPORTANT: once a rank has agreed, it runs every collective of every round whatever fails
locally: a local failure is held and reported at the next settle (the last one follows the last
round), so no rank is left waiting in a broadcast.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import socket
from collections.abc import Callable, Mapping, Sequence

from snapshotkit._config import Config
from snapshotkit._dist import Group, describe_error, portable
from snapshotkit._format.checksum import crc32c, format_checksum, parse_checksum
from snapshotkit._format.entries import Entry, Piece, is_shared
from snapshotkit._restore.columns import ColumnView
from snapshotkit._restore.fetch import MIN_SUBRANGE_BYTES, PieceRead, read_pieces
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import run_sync
from snapshotkit.errors import ChecksumMismatchError, RankFailedError
from snapshotkit.storage import StoragePlugin

logger = logging.getLogger("snapshotkit.restore")

#: Pieces at least this large are broadcast on their own (into the destination when it is
#: contiguous CPU memory); smaller ones are packed per owner and round into one broadcast, so a
#: state of many small tensors costs a few collectives, not one per tensor.
_OWN_BROADCAST_BYTES = 1 << 20
#: Smallest chunk per owner and round, whatever the budget: below it, collectives dominate.
_MIN_CHUNK_BYTES = 1 << 20

_AGREE = "restore: agreeing on the replicated pieces to share"
_ROUND = "restore: sharing replicated pieces"


@dataclasses.dataclass(frozen=True)
class Transfer:
    """What one rank's restore moved.

    Attributes:
        read_bytes: bytes read from storage.
        received_bytes: bytes received from other ranks (pieces they read for this one).
    """

    read_bytes: int = 0
    received_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class _Offer:
    """One rank's opening of the agreement."""

    mode: bool | str
    host: str
    digest: str
    count: int


@dataclasses.dataclass(frozen=True)
class _Shared:
    """One shared piece of a round, and where it lands on this rank."""

    piece: Piece
    owner: int
    reads: tuple[PieceRead, ...]
    landing: memoryview
    #: The rank's destination itself (the bytes need no copy to it).
    landing_read: PieceRead | None


def open_session(group: Group, config: Config) -> ShareSession | None:
    """A session if ``group`` could share reads (several ranks, gloo), else None: no collective then.

    The opt-out (:attr:`Config.share_replicated_reads`) is decided in the agreement, so ranks
    that disagree about it still take part in the same collectives (and share nothing).
    """
    if not group.distributed:
        return None
    if not group.broadcasts_cpu():
        logger.debug("replicated reads are not shared: the process group's backend does not broadcast CPU tensors")
        return None
    return ShareSession(group, config)


class ShareSession:
    """One restore's sharing, on one rank: :meth:`share` or, after a failure, :meth:`abandon`."""

    def __init__(self, group: Group, config: Config) -> None:
        self.group = group
        self.config = config
        self._agreed = False
        self._quota_bytes = max(_MIN_CHUNK_BYTES, config.memory_budget_bytes // 2 // group.world_size)

    def abandon(self, error: BaseException) -> None:
        """Report ``error`` to the others' agreement, if this rank has not agreed yet (they raise there)."""
        if self._agreed:
            return
        self._agreed = True
        try:
            self.group.exchange(None, error, _AGREE)
        except BaseException as raised:
            if raised is not error:  # a timeout reaching the others: the caller raises its own error
                logger.debug("rank %d could not report its failure: %s", self.group.rank, raised)

    def share(
        self,
        plugin: StoragePlugin,
        reads: Sequence[PieceRead],
        view: Mapping[str, Entry],
        on_agreed: Callable[[], None] | None = None,
    ) -> tuple[Transfer, list[PieceRead]]:
        """Fetch the pieces every rank wants, each read by one rank; the reads left to this rank alone.

        ``on_agreed()`` is called once every rank agreed, before anything is read or received (a
        failure reported at the agreement left every destination as it was).
        """
        wanted = self._candidates(reads, view)
        pieces = self._agree(wanted, page_cached=plugin.capabilities.host_page_cache)
        if on_agreed is not None:
            on_agreed()
        if not pieces:
            return Transfer(), list(reads)
        shared = {id(read) for piece in pieces for read in wanted[piece]}
        rest = [read for read in reads if id(read) not in shared]
        rounds = _rounds(_owners(pieces, self.group.world_size), self._quota_bytes)
        logger.debug(
            "rank %d shares %d replicated pieces (%d bytes) in %d rounds",
            self.group.rank,
            len(pieces),
            sum(p.nbytes for p in pieces),
            len(rounds),
        )
        return self._run(plugin, rounds, wanted), rest

    # ------------------------------------------------------------------ agreeing

    def _candidates(self, reads: Sequence[PieceRead], view: Mapping[str, Entry]) -> dict[Piece, list[PieceRead]]:
        wanted: dict[Piece, list[PieceRead]] = {}
        # a ColumnView answers from its columns, with no entry built
        shared = view.is_shared if isinstance(view, ColumnView) else functools.partial(_shared_in, view)
        for read in reads:
            if read.piece.nbytes and shared(read.logical_path):
                wanted.setdefault(read.piece, []).append(read)
        # A piece this rank would stream in sub-ranges (no contiguous destination, larger than the
        # budget) is read here as without sharing: a bounce buffer of its size would break the budget.
        threshold = max(self.config.memory_budget_bytes, MIN_SUBRANGE_BYTES)
        return {
            piece: found
            for piece, found in wanted.items()
            if piece.nbytes <= threshold or any(read.direct is not None for read in found)
        }

    def _agree(self, wanted: Mapping[Piece, list[PieceRead]], *, page_cached: bool) -> list[Piece]:
        self._agreed = True
        pieces = sorted(wanted, key=_order)
        digest = hashlib.sha256()
        for piece in pieces:
            digest.update(repr(_order(piece)).encode())
        offer = _Offer(self.config.share_replicated_reads, socket.gethostname(), digest.hexdigest(), len(pieces))
        offers: list[_Offer] = self.group.exchange(offer, None, _AGREE)
        if any(o.mode is False for o in offers):
            return []
        if page_cached and all(o.mode == "auto" for o in offers) and len({o.host for o in offers}) == 1:
            # One host, one page cache: the store reads each byte once however many ranks ask.
            logger.debug("replicated reads are not shared: every rank reads through one host's page cache")
            return []
        if all(o.digest == offer.digest and o.count == offer.count for o in offers):
            return pieces
        # Ranks want different pieces (strict=False, other keys, resharding): share the common ones.
        lists: list[list[Piece]] = self.group.all_gather_object(pieces, _AGREE)
        common = set(lists[0]).intersection(*lists[1:])
        return [piece for piece in pieces if piece in common]

    # ------------------------------------------------------------------ the rounds

    def _run(
        self, plugin: StoragePlugin, rounds: list[list[tuple[Piece, int]]], wanted: Mapping[Piece, list[PieceRead]]
    ) -> Transfer:
        held: BaseException | None = None
        read_bytes = received_bytes = 0
        for round_pieces in rounds:
            landed: list[_Shared] = []
            broadcasts: list[tuple[memoryview, int]] = []
            if held is None:
                try:
                    landed, broadcasts = self._land(round_pieces, wanted)
                    read_bytes += self._read_owned(plugin, landed)
                except Exception as exc:
                    held = exc
            self._settle(held)  # every rank raises here if any failed: nobody enters the broadcasts
            self.group.broadcast_into(broadcasts, _ROUND)
            received_bytes += sum(len(buffer) for buffer, src in broadcasts if src != self.group.rank)
            try:
                for shared in landed:
                    self._deliver(shared)
            except Exception as exc:
                held = exc
        self._settle(held)
        return Transfer(read_bytes, received_bytes)

    def _land(
        self, round_pieces: list[tuple[Piece, int]], wanted: Mapping[Piece, list[PieceRead]]
    ) -> tuple[list[_Shared], list[tuple[memoryview, int]]]:
        """Where each piece of the round lands on this rank, and the round's broadcasts: the same
        sizes and order on every rank. Per owner, its small pieces land in one packed buffer,
        broadcast whole; its large ones in their destination (or a buffer of their size),
        broadcast in sub-ranges of at most a chunk."""
        landed: list[_Shared] = []
        broadcasts: list[tuple[memoryview, int]] = []
        by_owner: dict[int, list[Piece]] = {}
        for piece, owner in round_pieces:
            by_owner.setdefault(owner, []).append(piece)
        for owner in sorted(by_owner):
            small = [piece for piece in by_owner[owner] if piece.nbytes < _OWN_BROADCAST_BYTES]
            if small:
                pack = memoryview(bytearray(sum(piece.nbytes for piece in small)))
                broadcasts.append((pack, owner))
                offset = 0
                for piece in small:
                    landing = pack[offset : offset + piece.nbytes]
                    landed.append(_Shared(piece, owner, tuple(wanted[piece]), landing, None))
                    offset += piece.nbytes
            for piece in by_owner[owner]:
                if piece.nbytes < _OWN_BROADCAST_BYTES:
                    continue
                reads = tuple(wanted[piece])
                into = next((read for read in reads if read.direct is not None), None)
                landing = into.direct if into is not None and into.direct is not None else _bounce(piece)
                landed.append(_Shared(piece, owner, reads, landing, into))
                step = self._quota_bytes
                broadcasts.extend((landing[start : start + step], owner) for start in range(0, piece.nbytes, step))
        return landed, broadcasts

    def _read_owned(self, plugin: StoragePlugin, landed: list[_Shared]) -> int:
        rank = self.group.rank
        owned = [PieceRead(s.piece, s.reads[0].logical_path, direct=s.landing) for s in landed if s.owner == rank]
        if not owned:
            return 0
        config = self.config
        return run_sync(
            read_pieces(
                plugin,
                owned,
                budget=MemoryBudget(config.memory_budget_bytes),
                io_concurrency=config.io_concurrency,
                verify=config.verify_checksums,
            )
        )

    def _deliver(self, shared: _Shared) -> None:
        """Verify what this rank received (the owner verified its read), then hand it to every read."""
        data, piece = shared.landing, shared.piece
        if shared.owner != self.group.rank and self.config.verify_checksums:
            value = crc32c(data)
            if value != parse_checksum(piece.checksum):
                raise ChecksumMismatchError(
                    f"checksum mismatch for logical path {shared.reads[0].logical_path!r}: bytes "
                    f"{list(piece.byte_range)} of data object {piece.address!r}, received from rank {shared.owner}, "
                    f"have {format_checksum(value)}, the manifest says {piece.checksum}. They changed on the way "
                    "between ranks; restore again, or set SNAPSHOTKIT_SHARE_REPLICATED_READS=0 to read them from "
                    "storage on every rank"
                )
        for read in shared.reads:
            if read is shared.landing_read:
                continue
            if read.direct is not None:
                read.direct[:] = data
            elif read.consume is not None:
                read.consume(0, data)

    def _settle(self, held: BaseException | None) -> None:
        """Every rank's outcome so far; if any rank failed, raise on every rank (see :func:`_failure`)."""
        outcome = None if held is None else (portable(held), describe_error(held))
        outcomes: list[tuple[BaseException | None, str] | None] = self.group.all_gather_object(outcome, _ROUND)
        failed = [(rank, o) for rank, o in enumerate(outcomes) if o is not None]
        if not failed:
            return
        if held is not None:
            raise held
        rank, (error, text) = failed[0]
        raise _failure(rank, error, text)


def _failure(rank: int, error: BaseException | None, text: str) -> BaseException:
    """This rank's error for a piece rank ``rank`` failed to read or pass on: of the same class
    (an IntegrityError stays one, naming the logical path), the original as the cause."""
    message = f"{error} (rank {rank} read it for the group, sharing replicated pieces)"
    clone: BaseException
    try:
        clone = (
            type(error)(message)
            if error is not None
            else RankFailedError(f"{_ROUND}: rank {rank} failed with {text}", rank)
        )
    except Exception:
        clone = RankFailedError(f"{_ROUND}: rank {rank} failed with {text}", rank)
    clone.__cause__ = error
    return clone


def _order(piece: Piece) -> tuple[str, tuple[int, int], str]:
    return (piece.address, piece.byte_range, piece.checksum)


def _shared_in(view: Mapping[str, Entry], logical_path: str) -> bool:
    entry = view.get(logical_path)
    return entry is not None and is_shared(entry)


def _bounce(piece: Piece) -> memoryview:
    return memoryview(bytearray(piece.nbytes))


def _owners(pieces: Sequence[Piece], world_size: int) -> list[tuple[Piece, int]]:
    """Each piece (in storage order) with its owner: ``world_size`` contiguous runs of about
    equal bytes, by where each piece's middle falls in the cumulative bytes."""
    total = sum(piece.nbytes for piece in pieces)
    owned: list[tuple[Piece, int]] = []
    before = 0
    for piece in pieces:
        owner = min(world_size - 1, ((2 * before + piece.nbytes) * world_size) // (2 * total))
        owned.append((piece, owner))
        before += piece.nbytes
    return owned


def _rounds(owned: list[tuple[Piece, int]], quota_bytes: int) -> list[list[tuple[Piece, int]]]:
    """Round k holds every owner's k-th chunk of at most ``quota_bytes`` (a larger piece alone)."""
    chunks: dict[int, list[list[tuple[Piece, int]]]] = {}
    filled: dict[int, int] = {}
    for piece, owner in owned:
        mine = chunks.setdefault(owner, [])
        if not mine or (filled[owner] + piece.nbytes > quota_bytes and filled[owner] > 0):
            mine.append([])
            filled[owner] = 0
        mine[-1].append((piece, owner))
        filled[owner] += piece.nbytes
    count = max((len(c) for c in chunks.values()), default=0)
    return [
        [item for owner in sorted(chunks) if k < len(chunks[owner]) for item in chunks[owner][k]] for k in range(count)
    ]
