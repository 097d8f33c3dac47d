"""Checking a copy's bytes as they arrive, against the manifest that arrived before them.

A peer sends a copy manifest first (:mod:`.transfer`), so the receiver knows every stored piece
(data object, byte range, CRC-32C and, from format 4, content hash) before the first data byte.
:class:`ArrivalCheck` then checks each data object's bytes while they pass through the receive
buffer, in the order they arrive, instead of reading the written copy back
(:func:`~snapshotkit.verify.verify_snapshot`): the same checks, one pass fewer over the bytes.

Problems are :class:`~snapshotkit.verify.VerifyProblem` values, as ``verify_snapshot`` reports
them. IMPORTANT: a piece counts as verified only once every one of its bytes was fed and both its
checksum and its hash (where the manifest has one) matched; anything short of that, a data
object that never arrived, one that ends before a piece, is a problem. Pieces an incremental take
left in a base snapshot are not in the copy: :attr:`ArrivalCheck.bases` says that there are some,
for the caller to verify the placed copy with its bases (as before).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from snapshotkit._format.checksum import content_hasher, crc32c, finish_hash, format_checksum, parse_checksum
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._inspect.pieces import StoredPiece, display_path, stored_pieces
from snapshotkit.verify import VerifyProblem

__all__ = ["ArrivalCheck", "FileCheck"]


class ArrivalCheck:
    """The pieces of a copy, checked as their data objects' bytes arrive.

    Args:
        metadata: the copy's decoded manifest.
        sizes: every data object the sender sends (relative path -> size in bytes).
    """

    def __init__(self, metadata: SnapshotMetadata, sizes: Mapping[str, int]) -> None:
        self.problems: list[VerifyProblem] = []
        #: Whether some pieces are in base snapshots (not checked here).
        self.bases = False
        self._by_location: dict[str, list[tuple[StoredPiece, str]]] = {}
        for stored in stored_pieces(metadata):
            piece = stored.piece
            if piece.base is not None:
                self.bases = True
                continue
            name = display_path(stored.keys[0], metadata.world_size)
            size_bytes = sizes.get(piece.location)
            if size_bytes is None:
                self.problems.append(
                    VerifyProblem(
                        name, piece.location, "missing", f"data object {piece.location!r} of {name!r} was not sent"
                    )
                )
            elif piece.byte_range[1] > size_bytes:
                self.problems.append(
                    VerifyProblem(
                        name,
                        piece.location,
                        "truncated",
                        f"data object {piece.location!r} ends at byte {size_bytes}, before the end of "
                        f"{name!r} (bytes {list(piece.byte_range)})",
                    )
                )
            else:
                self._by_location.setdefault(piece.location, []).append((stored, name))
        self._started: set[str] = set()

    def file(self, location: str) -> FileCheck:
        """The check of ``location``'s bytes, to be fed from its first byte on (once per location)."""
        self._started.add(location)
        return FileCheck(location, self._by_location.get(location, []), self.problems)

    def finish(self) -> list[VerifyProblem]:
        """Every problem found; call once every data object was fed and closed."""
        for location, pieces in self._by_location.items():
            if location not in self._started:  # listed but never fed: the caller stopped early
                self.problems.extend(
                    VerifyProblem(name, location, "missing", f"{name!r} was not received") for _, name in pieces
                )
        return self.problems


@dataclasses.dataclass
class _Running:
    """A piece whose bytes are being fed: the CRC and hash so far, and how many bytes they cover."""

    stored: StoredPiece
    name: str
    crc: int = 0
    hasher: Any = None
    done: int = 0


class FileCheck:
    """Checks one data object's pieces from its bytes, fed in order (:meth:`update`)."""

    def __init__(self, location: str, pieces: list[tuple[StoredPiece, str]], problems: list[VerifyProblem]) -> None:
        self.location = location
        self._waiting = sorted(pieces, key=lambda item: item[0].piece.byte_range, reverse=True)  # next one last
        self._running: list[_Running] = []
        self._problems = problems
        self._position = 0

    def update(self, data: memoryview) -> None:
        """Feed the next ``len(data)`` bytes of the data object."""
        end = self._position + len(data)
        while self._waiting and self._waiting[-1][0].piece.byte_range[0] < end:
            self._start_next()
        finished = []
        for running in self._running:
            start, stop = running.stored.piece.byte_range
            lo, hi = max(start + running.done, self._position), min(stop, end)
            if hi > lo:
                part = data[lo - self._position : hi - self._position]
                running.crc = crc32c(part, running.crc)
                if running.hasher is not None:
                    running.hasher.update(part)
                running.done += hi - lo
            if running.done == stop - start:
                finished.append(running)
        for running in finished:
            self._running.remove(running)
            self._judge(running)
        self._position = end

    def close(self) -> None:
        """The data object ended: every piece not yet whole is a problem (then its last pieces
        with no bytes, which only now are known to be at its end, are judged)."""
        while self._waiting and self._waiting[-1][0].piece.byte_range[0] <= self._position:
            self._start_next()
        for running in self._running:
            if running.done == running.stored.piece.nbytes:
                self._judge(running)
            else:
                self._truncated(running.stored, running.name)
        for stored, name in self._waiting:
            self._truncated(stored, name)
        self._running, self._waiting = [], []

    def _start_next(self) -> None:
        """Begin the CRC (and hash) of the next waiting piece, the one that starts first."""
        stored, name = self._waiting.pop()
        hasher = content_hasher() if stored.piece.hash is not None else None
        self._running.append(_Running(stored, name, hasher=hasher))

    def _truncated(self, stored: StoredPiece, name: str) -> None:
        self._problems.append(
            VerifyProblem(
                name,
                self.location,
                "truncated",
                f"data object {self.location!r} ended at byte {self._position}, before the end of {name!r} "
                f"(bytes {list(stored.piece.byte_range)})",
            )
        )

    def _judge(self, running: _Running) -> None:
        piece = running.stored.piece
        if running.crc != parse_checksum(piece.checksum):
            self._problems.append(
                VerifyProblem(
                    running.name,
                    self.location,
                    "checksum",
                    f"checksum mismatch for logical path {running.name!r}: bytes {list(piece.byte_range)} of data "
                    f"object {self.location!r} have {format_checksum(running.crc)}, the manifest says {piece.checksum}",
                )
            )
        elif running.hasher is not None and (found := finish_hash(running.hasher)) != piece.hash:
            self._problems.append(
                VerifyProblem(
                    running.name,
                    self.location,
                    "hash",
                    f"content hash mismatch for logical path {running.name!r}: bytes {list(piece.byte_range)} of "
                    f"data object {self.location!r} have {found}, the manifest says {piece.hash}",
                )
            )
