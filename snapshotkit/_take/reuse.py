"""Incremental takes: which staged pieces a base snapshot already holds, and what is left to write.

Reuse is decided by content, never by identity: every staged piece gets its content hash
(128-bit XXH3) beside its CRC-32C, and a piece whose hash, length and CRC-32C equal a piece of
the base is recorded as a *reference* to the base's bytes instead of being written. A change
made through ``.data``, a NumPy view or another process changes the bytes, hence the hash.
Pieces smaller than ``Config.min_reference_bytes`` are always written.

References never chain: a base piece that is itself a reference is reused by pointing at the
snapshot that holds the bytes, so reading an incremental snapshot opens its bases, never their
bases. Where the bytes are checksummed (a writer thread, or the checkpoint daemon),
:func:`decide` first picks the pieces a base holds (only pieces whose CRC-32C and length match a
base piece are hashed before the write), the data object then holds only the pieces it keeps,
packed again in order, and :meth:`Layout.finish` checksums and hashes those *while* they are
written. A data object whose pieces are all reused is not written at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from snapshotkit._format.bases import base_location_for, resolve_base
from snapshotkit._format.checksum import checksum_and_hash, content_hash, crc32c, format_checksum
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import pieces_of
from snapshotkit._format.pieces import Piece
from snapshotkit._plan.layout import ALIGNMENT_BYTES
from snapshotkit.errors import ConfigError

_PADDING = memoryview(bytes(ALIGNMENT_BYTES))
#: Pieces up to this size are checksummed and hashed in two calls, each over all of the piece
#: (it stays in a core's cache): cheaper than :func:`checksum_and_hash`'s block loop for a take of
#: many small tensors, with the same results.
_SMALL_PIECE_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class ReuseIndex:
    """The pieces a take may reference instead of writing.

    Attributes:
        by_hash: content hash -> the piece as the new snapshot references it (``base`` set).
        bases: base location -> that base's snapshot id, for every base a reference may name.
        min_bytes: pieces shorter than this are written even when a base holds them.
        base_path: the base the take was given (for messages).
        candidates: ``(checksum, length)`` of every piece in ``by_hash``: a staged piece is
            hashed before the write only if it matches one.
    """

    by_hash: Mapping[str, Piece]
    bases: Mapping[str, str]
    min_bytes: int
    base_path: str = ""
    candidates: frozenset[tuple[str, int]] = frozenset()

    def __post_init__(self) -> None:
        if not self.candidates and self.by_hash:
            found = frozenset((piece.checksum, piece.nbytes) for piece in self.by_hash.values())
            object.__setattr__(self, "candidates", found)

    def lookup(self, digest: str, nbytes: int, checksum: str) -> Piece | None:
        """The reference for a piece of ``nbytes`` bytes with this hash and CRC, if a base holds it."""
        if nbytes < self.min_bytes:
            return None
        found = self.by_hash.get(digest)
        if found is None or found.nbytes != nbytes or found.checksum != checksum:
            return None
        return found


def build_reuse_index(
    path: str, base_path: str, base: SnapshotMetadata, min_bytes: int, intact: Collection[str] | None = None
) -> ReuseIndex:
    """What a take to ``path`` may reuse of the snapshot ``base`` at ``base_path``.

    The base's own pieces become references to it; its references stay references to the
    snapshots that hold the bytes, when those lie in the folder that holds ``path`` too and are
    among ``intact`` (the base's bases that still have the referenced ids; default: all). A
    reference to a base that is gone or replaced is never copied: those bytes are written.

    Raises:
        ConfigError: the base is not a snapshot in the folder that holds ``path``, or is ``path``.
    """
    own = base_location_for(path, base_path)
    if base.snapshot_id is None:  # format 1-3: no id to check, no hashes to compare
        return ReuseIndex({}, {}, min_bytes, base_path)
    holders: dict[str | None, str | None] = {None: own}
    bases: dict[str, str] = {}
    for location, base_id in base.bases.items():
        if intact is not None and location not in intact:
            holders[location] = None
            continue
        try:
            holder = base_location_for(path, resolve_base(base_path, location))
        except (ConfigError, ValueError):
            holders[location] = None  # outside the new snapshot's folder: written again instead
            continue
        holders[location], bases[holder] = holder, base_id
    bases[own] = base.snapshot_id
    by_hash: dict[str, Piece] = {}
    for entry in base.manifest.values():
        for piece in pieces_of(entry):
            found = holders.get(piece.base)
            if piece.hash is None or found is None or piece.nbytes < min_bytes or piece.hash in by_hash:
                continue
            by_hash[piece.hash] = dataclasses.replace(piece, base=found)
    return ReuseIndex(by_hash, bases, min_bytes, base_path)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A staged data object after the reuse decision, before the hashes of what it writes.

    Attributes:
        location: the data object.
        views: every slot's staged bytes, in slot order.
        references: per slot, the base's piece it reuses, or None (written here).
        offsets: per slot, where it is written in the data object (-1 for a reference).
        checksums: per slot, its CRC-32C text when the decision needed it, else None.
        buffers: what to write to the data object, back to back (empty: write nothing).
        written_bytes: the bytes of the pieces written (padding excluded).
    """

    location: str
    views: tuple[memoryview, ...]
    references: tuple[Piece | None, ...]
    offsets: tuple[int, ...]
    checksums: tuple[str | None, ...]
    buffers: tuple[memoryview, ...]
    written_bytes: int

    def finish(self) -> tuple[Piece, ...]:
        """Every slot's final piece: the references, and the written pieces checksummed and hashed.

        Runs beside the write of :attr:`buffers` (the bytes do not change while both run), so a
        full take pays for checksums and hashes only where the write would leave a core idle.
        """
        pieces: list[Piece] = []
        location = self.location
        for view, found, offset, checksum in zip(
            self.views, self.references, self.offsets, self.checksums, strict=True
        ):
            if found is not None:
                pieces.append(found)
                continue
            nbytes = view.nbytes
            if checksum is not None:
                digest = content_hash(view)
            elif nbytes <= _SMALL_PIECE_BYTES:  # in cache for both passes: two calls, no block loop
                checksum, digest = format_checksum(crc32c(view)), content_hash(view)
            else:  # one pass over the bytes for both
                value, digest = checksum_and_hash(view)
                checksum = format_checksum(value)
            pieces.append(Piece(location, (offset, offset + nbytes), checksum, digest))
        return tuple(pieces)


def decide(location: str, views: Sequence[memoryview], reuse: ReuseIndex | None) -> Layout:
    """Which staged pieces (``views``, in slot order, of data object ``location``) a base holds, and
    where the others go: packed in order at aligned offsets.

    Only a piece whose CRC-32C and length equal a reusable base piece's is hashed here (to confirm
    the match); without a base nothing is read at all. :meth:`Layout.finish` does the rest.
    """
    references: list[Piece | None] = []
    offsets: list[int] = []
    checksums: list[str | None] = []
    buffers: list[memoryview] = []
    offset = written = 0
    for view in views:
        nbytes, found, checksum = view.nbytes, None, None
        if reuse is not None and nbytes >= reuse.min_bytes:
            checksum = format_checksum(crc32c(view))
            if (checksum, nbytes) in reuse.candidates:
                found = reuse.lookup(content_hash(view), nbytes, checksum)
        references.append(found)
        checksums.append(checksum)
        if found is not None:
            offsets.append(-1)
            continue
        start = -(-offset // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
        if start > offset:
            buffers.append(_PADDING[: start - offset])
        buffers.append(view)
        offsets.append(start)
        offset, written = start + nbytes, written + nbytes
    return Layout(location, tuple(views), tuple(references), tuple(offsets), tuple(checksums), tuple(buffers), written)


@dataclasses.dataclass(frozen=True)
class Settled:
    """A staged data object after :func:`settle`.

    Attributes:
        pieces: the final piece of every slot, in slot order (written here, or a reference).
        buffers: what to write to the data object, back to back (empty: write nothing).
        written_bytes: the bytes of the pieces written (padding excluded).
    """

    pieces: tuple[Piece, ...]
    buffers: tuple[memoryview, ...]
    written_bytes: int


def settle(location: str, views: Sequence[memoryview], reuse: ReuseIndex | None) -> Settled:
    """:func:`decide` and :meth:`Layout.finish` one after the other (for callers that do not
    overlap the hashing with the write)."""
    layout = decide(location, views, reuse)
    return Settled(layout.finish(), layout.buffers, layout.written_bytes)


def referenced_bases(pieces: Sequence[Piece], bases: Mapping[str, str]) -> dict[str, str]:
    """The ``bases`` header of a manifest with these pieces: each base a piece references -> its id."""
    used = sorted({piece.base for piece in pieces if piece.base is not None})
    return {location: bases[location] for location in used}
