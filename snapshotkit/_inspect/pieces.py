"""A snapshot's stored pieces as its manifest records them: who holds each, and how big the data objects are.

Only the manifest is consulted here (no I/O). A piece shared by several entries (tied weights)
appears once, with every manifest key that holds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import Piece, pieces_of


@dataclasses.dataclass(frozen=True)
class StoredPiece:
    """One distinct stored piece and the manifest keys (``"<rank>/<logical path>"``) whose entries hold it."""

    piece: Piece
    keys: tuple[str, ...]


def stored_pieces(metadata: SnapshotMetadata) -> list[StoredPiece]:
    """Every distinct piece of the snapshot, ordered by data object and offset."""
    # The piece is kept as the manifest has it (its base included): a reader checks a referenced
    # base's snapshot id before reading from it only when it knows the piece is a reference.
    holders: dict[tuple[str, tuple[int, int], str], tuple[Piece, list[str]]] = {}
    for key, entry in metadata.manifest.items():
        for piece in pieces_of(entry):
            holders.setdefault((piece.address, piece.byte_range, piece.checksum), (piece, []))[1].append(key)
    ordered = sorted(holders.items(), key=lambda item: (item[0][0], item[0][1]))
    return [StoredPiece(piece, tuple(keys)) for _, (piece, keys) in ordered]


def data_object_bytes(metadata: SnapshotMetadata) -> dict[str, int]:
    """Each data object's size as the manifest implies it: the end of its last piece.

    A take writes every data object up to the end of its last piece and no further, so for a
    committed snapshot this is the object's size in storage (without a size call in the SPI).
    """
    sizes: dict[str, int] = {}
    for stored in stored_pieces(metadata):
        location, end = stored.piece.address, stored.piece.byte_range[1]
        sizes[location] = max(sizes.get(location, 0), end)
    return sizes


def display_path(key: str, world_size: int) -> str:
    """How tools name the entry at manifest ``key``: its logical path when one rank took the
    snapshot, else the key itself (``"1/model/w"``, a form ``read_object`` accepts too)."""
    return key.split("/", 1)[1] if world_size == 1 else key


def display_paths(keys: Iterable[str], world_size: int) -> list[str]:
    return [display_path(key, world_size) for key in keys]
