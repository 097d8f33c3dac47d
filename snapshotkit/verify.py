"""Verify a snapshot: read every stored byte, check every checksum, list every problem.

    from snapshotkit.verify import verify_snapshot

    report = verify_snapshot("s3://bucket/run7/step_1000")
    for problem in report.problems:
        print(problem.logical_path, problem.kind, problem.message)

A restore stops at the first damaged piece; :func:`verify_snapshot` goes on and reports them
all, each by logical path. It reads through the restore side's pipeline (the same ranged reads,
checksums and error messages) under a memory budget, and never loads a tensor or unpickles an
object. ``snapshotkit verify`` is the command-line face of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from snapshotkit._config import Config, snapshot_path
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._inspect.check import check_pieces
from snapshotkit._inspect.pieces import StoredPiece, display_path, stored_pieces
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit.errors import ManifestError, UnsupportedFormatVersionError
from snapshotkit.snapshot import Snapshot

__all__ = ["VerifyProblem", "VerifyReport", "verify_snapshot"]


class VerifyProblem(NamedTuple):
    """One damaged piece, for one logical path that holds it.

    Attributes:
        logical_path: the logical path (``"model/layer1.weight"``); ``"<rank>/<logical path>"``
            when several ranks took the snapshot; ``""`` for the manifest itself.
        location: the data object (or ``.snapshot_metadata``) holding the bad bytes.
        kind: ``"checksum"`` (bytes differ from their checksum), ``"hash"`` (the checksum
            matches, the content hash does not), ``"truncated"`` (the data object ends before the
            piece), ``"missing"`` (the data object does not exist), ``"base"`` (the base snapshot
            holding it is gone, replaced or damaged), ``"refused"`` (the data object is not a
            regular file inside the snapshot) or ``"manifest"`` (the manifest fails its integrity
            check or is malformed: nothing else could be checked).
        message: what is wrong, as a restore would say it.
    """

    logical_path: str
    location: str
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_snapshot` found.

    Attributes:
        path: the snapshot checked.
        bytes_checked: bytes read and checksummed (every piece's, when nothing is missing).
        pieces_checked: distinct stored pieces examined (a piece tied weights share counts once).
        problems: every damaged piece, by logical path, ordered by location and offset.
    """

    path: str
    bytes_checked: int
    pieces_checked: int
    problems: tuple[VerifyProblem, ...]

    @property
    def ok(self) -> bool:
        """Whether every piece verified."""
        return not self.problems


def verify_snapshot(
    path: str,
    *,
    storage_options: dict[str, Any] | None = None,
    memory_budget_bytes: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Read every stored piece of the snapshot at ``path`` and check its checksum.

    Damage is reported, not raised: every piece that fails (bad checksum, truncated or missing
    data object) is a :class:`VerifyProblem` naming its logical path, and the check goes on. A
    manifest that fails its integrity check is one problem of kind ``"manifest"``.

    Args:
        path: the snapshot (any path or URI :class:`~snapshotkit.Snapshot` opens).
        storage_options: passed to the storage plugin.
        memory_budget_bytes: host bytes the reads may hold at once (default as for restore:
            ``SNAPSHOTKIT_MEMORY_BUDGET_BYTES``, else 60% of available RAM, at most 32 GiB);
            pieces larger than the budget are read in sub-ranges of it.
        progress: called as ``progress(bytes_verified, bytes_total)`` while reading (from
            worker threads; the count may go back when a piece is read again to find a fault).

    Returns:
        The :class:`VerifyReport`; ``report.ok`` is true when nothing is damaged.

    Raises:
        SnapshotNotFoundError: nothing is at the path (``IncompleteSnapshotError``: the take never
            committed).
        UnsupportedFormatVersionError: written by a newer snapshotkit.
        StorageError: the store failed (the snapshot may be fine: check access and retry).
        ConfigError: ``memory_budget_bytes`` is not a positive integer.
    """
    where = snapshot_path(path)
    options = dict(storage_options or {})
    config = Config.resolve(memory_budget_bytes=memory_budget_bytes, verify_checksums=True)
    try:
        metadata = Snapshot(where, storage_options=options).metadata
    except UnsupportedFormatVersionError:
        raise
    except ManifestError as exc:
        return VerifyReport(where, 0, 0, (VerifyProblem("", METADATA_FILENAME, "manifest", str(exc)),))
    pieces = stored_pieces(metadata)

    def name(stored: StoredPiece) -> str:
        return display_path(stored.keys[0], metadata.world_size)

    with SnapshotReader(where, options, config, bases=metadata.bases) as reader:
        result = check_pieces(reader, pieces, name, progress)
    problems = tuple(
        VerifyProblem(display_path(key, metadata.world_size), found.stored.piece.address, found.kind, found.message)
        for found in result.problems
        for key in found.stored.keys
    )
    return VerifyReport(where, result.bytes_checked, len(pieces), problems)
