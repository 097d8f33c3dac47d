"""Checking every stored piece of a snapshot and finding *all* the damaged ones.

A restore stops at the first bad piece; a check goes on. It reads every piece once through the
restore side's fetch pipeline (batched ranged reads, checksums verified, bounce buffers under
the budget), and also recomputes each piece's content hash where the manifest has one (format
4). Only when that fails does it look closer: data objects that are missing altogether
are found with one probe each, and the remaining pieces that did not verify are split in halves
and read again until each failure is pinned to its piece. Damage costs a few re-reads; a
healthy snapshot is read exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from snapshotkit._format.checksum import content_hasher, finish_hash
from snapshotkit._inspect.pieces import StoredPiece
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._restore.fetch import Claim, PieceRead
from snapshotkit._runtime.loop import gather_or_cancel
from snapshotkit.errors import BaseSnapshotError, ChecksumMismatchError, IntegrityError, TruncatedDataError

#: ``progress(bytes_verified, bytes_total)``; may go down when a piece is read again.
Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class PieceProblem:
    """A piece that did not verify.

    Attributes:
        stored: the piece and the manifest keys holding it.
        kind: ``"checksum"`` (its bytes differ from the manifest's checksum), ``"hash"`` (its
            checksum matches but its content hash does not), ``"truncated"`` (its data object
            ends before it), ``"missing"`` (its data object does not exist), ``"base"`` (the base
            snapshot holding it is gone, replaced or damaged) or ``"refused"`` (its data object is
            not a regular file inside the snapshot).
        message: what a restore would say of it, without advice on reading it anyway (a report
            names what is wrong; what to do is the caller's: restore from another snapshot).
    """

    stored: StoredPiece
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What :func:`check_pieces` found: ``bytes_checked`` counts the bytes read and checksummed."""

    bytes_checked: int
    problems: tuple[PieceProblem, ...]


def problem_kind(exc: IntegrityError) -> str:
    """The :attr:`PieceProblem.kind` of a fetch's integrity error."""
    if isinstance(exc, BaseSnapshotError):
        return "base"
    if isinstance(exc, ChecksumMismatchError):
        return "checksum"
    if isinstance(exc, TruncatedDataError):
        return "truncated"
    return "missing" if isinstance(exc.__cause__, FileNotFoundError) else "refused"


def _message(exc: IntegrityError) -> str:
    """``exc``'s message for a report: its problem alone where its advice is to restore another
    snapshot (the restore's words also offer ``verify_checksums=False``, which a report has not)."""
    advice = exc.advice
    if advice is not None and advice.action == "restore_another":
        return advice.problem
    return str(exc)


class _Tally:
    """Per piece: verified bytes so far and whether it verified (fetch consumers run on worker threads)."""

    def __init__(self, pieces: Sequence[StoredPiece], progress: Progress | None) -> None:
        self._sizes = [stored.piece.nbytes for stored in pieces]
        self._expected = [stored.piece.hash for stored in pieces]
        self._hashers: dict[int, Any] = {}
        #: Pieces whose bytes passed the checksum but not the content hash: index -> digest found.
        self.hash_mismatch: dict[int, str] = {}
        self._total = sum(self._sizes)
        self._done = [0] * len(pieces)
        self.ok = [False] * len(pieces)
        self._sum = 0
        self._progress = progress
        self._lock = threading.Lock()

    def consumer(self, index: int) -> Callable[[int, memoryview], None]:
        def consume(within: int, data: memoryview) -> None:
            with self._lock:
                if within == 0:
                    self._hashers.pop(index, None)
                if self._expected[index] is not None:
                    self._hashers.setdefault(index, content_hasher()).update(data)
                self._done[index] += data.nbytes
                self._sum += data.nbytes
                # The fetch hands over the last bytes of a piece only once its checksum matched.
                complete = within + data.nbytes == self._sizes[index]
                if complete and self._expected[index] is not None:
                    found = finish_hash(self._hashers.pop(index))
                    if found != self._expected[index]:
                        self.hash_mismatch[index] = found
                self.ok[index] = self.ok[index] or complete
                self._report()

        return consume

    def restart(self, index: int) -> None:
        with self._lock:
            self._sum -= self._done[index]
            self._done[index] = 0
            self._report()

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(self._sum, self._total)


def check_pieces(
    reader: SnapshotReader,
    pieces: Sequence[StoredPiece],
    name: Callable[[StoredPiece], str],
    progress: Progress | None = None,
) -> CheckResult:
    """Read and verify every piece in ``pieces``; every one that fails is a problem.

    Args:
        reader: reads the snapshot the pieces belong to.
        pieces: distinct pieces (see :func:`~snapshotkit._inspect.pieces.stored_pieces`).
        name: the logical path error messages name a piece by.
        progress: called with the bytes verified so far and the total.

    Raises:
        StorageError: the store failed (not the snapshot's bytes): nothing can be concluded.
    """
    tally = _Tally(pieces, progress)
    reads = [PieceRead(s.piece, name(s), consume=tally.consumer(i), splittable=True) for i, s in enumerate(pieces)]
    problems: dict[int, PieceProblem] = {}

    async def probe(location: str, indices: list[int], slots: asyncio.Semaphore) -> None:
        claims = [Claim(reads[i].logical_path, pieces[i].piece, False) for i in indices]
        try:
            async with slots:
                await reader.prove(claims)
        except TruncatedDataError:
            return  # some pieces may still be whole: the halving finds which
        except IntegrityError as exc:  # the data object is missing or refused: so is every piece in it
            for i in indices:
                problems[i] = PieceProblem(pieces[i], problem_kind(exc), _message(exc))

    async def halve(indices: list[int]) -> None:
        for i in indices:
            tally.restart(i)
        try:
            await reader.fetch([reads[i] for i in indices])
            return
        except IntegrityError as exc:
            failure = exc
        unverified = [i for i in indices if not tally.ok[i]]
        if len(unverified) == 1:
            problems[unverified[0]] = PieceProblem(pieces[unverified[0]], problem_kind(failure), _message(failure))
        elif unverified:
            middle = len(unverified) // 2
            await halve(unverified[:middle])
            await halve(unverified[middle:])

    async def check() -> None:
        everything = list(range(len(pieces)))
        try:
            await reader.fetch(reads)
            return
        except IntegrityError:
            pass
        by_object: dict[str, list[int]] = {}
        for i in everything:
            if not tally.ok[i] and pieces[i].piece.nbytes:
                by_object.setdefault(pieces[i].piece.address, []).append(i)
        slots = asyncio.Semaphore(reader.config.io_concurrency)
        await gather_or_cancel([probe(location, indices, slots) for location, indices in by_object.items()])
        await halve([i for i in everything if not tally.ok[i] and i not in problems])

    reader.run(check())
    for i, found in tally.hash_mismatch.items():
        problems.setdefault(
            i,
            PieceProblem(
                pieces[i],
                "hash",
                f"content hash mismatch for logical path {name(pieces[i])!r}: bytes {list(pieces[i].piece.byte_range)} "
                f"of data object {pieces[i].piece.address!r} have {found}, the manifest says {pieces[i].piece.hash}. "
                "The snapshot is corrupt or was edited; restore from another snapshot",
            ),
        )
    ordered = tuple(problems[i] for i in sorted(problems))
    read_whole = [i for i in range(len(pieces)) if tally.ok[i] or (i in problems and problems[i].kind == "checksum")]
    return CheckResult(sum(pieces[i].piece.nbytes for i in read_whole), ordered)
