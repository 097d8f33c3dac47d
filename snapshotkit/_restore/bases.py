"""Reading an incremental snapshot: the storage of the snapshot and of the bases it references.

A referenced piece's *address* is ``"<base>/<location>"`` (``"../step_10/data/0_00000_ab12cd34"``,
:attr:`~snapshotkit._format.pieces.Piece.address`); the rest of the read pipeline groups and
fetches by address. :class:`ReferencingStorage` wraps the snapshot's plugin and serves addresses
under a base from a plugin opened on that base (same storage options), so fetching, range merging
and checksums work unchanged.

IMPORTANT: before the first byte of a base is read, :meth:`ReferencingStorage.check_bases` reads
the base's manifest and checks that it is the very snapshot the reference was made against (its
``snapshot_id``): a base that was deleted, replaced by another snapshot of the same name, or
damaged is a :class:`~snapshotkit.errors.BaseSnapshotError` naming the base and the logical paths
that needed it, raised before anything is allocated or overwritten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence

from snapshotkit._format.bases import resolve_base
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.pieces import METADATA_FILENAME, Piece
from snapshotkit._restore.failures import storage_failure
from snapshotkit._restore.metadata import load_metadata
from snapshotkit._text import describe_paths
from snapshotkit.errors import BaseSnapshotError, SnapshotkitError
from snapshotkit.storage import ByteRange, StoragePlugin, open_storage_plugin

OpenAt = Callable[[str], StoragePlugin]


class ReferencingStorage(StoragePlugin):
    """Reads of a snapshot at ``path`` and of its ``bases`` (base location -> snapshot id).

    Args:
        plugin: the snapshot's own plugin (closed by :meth:`close`).
        path: the snapshot's path.
        bases: its manifest's ``bases``.
        open_at: opens a plugin on another path with the snapshot's storage options.
    """

    def __init__(self, plugin: StoragePlugin, path: str, bases: Mapping[str, str], open_at: OpenAt) -> None:
        self._plugin = plugin
        self.capabilities = plugin.capabilities
        self._path = path
        # Longest first, so an address finds the most specific base whose folder holds it.
        self._bases = dict(sorted(bases.items(), key=lambda item: -len(item[0])))
        self._open_at = open_at
        self._opened: dict[str, StoragePlugin] = {}
        self._checked: set[str] = set()
        self._lock = asyncio.Lock()

    def _route(self, address: str) -> tuple[StoragePlugin, str]:
        for base in self._bases:
            if address.startswith(base + "/"):
                plugin = self._opened.get(base)
                if plugin is None:
                    plugin = self._opened[base] = self._open_at(resolve_base(self._path, base))
                return plugin, address[len(base) + 1 :]
        return self._plugin, address

    async def check_bases(self, needed: Mapping[str, Iterable[str]]) -> None:
        """Check each base in ``needed`` (base location -> logical paths reading from it) once.

        Raises:
            BaseSnapshotError: a base is not listed in the manifest, is missing, damaged, or has
                another snapshot id than the one referenced.
        """
        async with self._lock:
            for base, logical_paths in needed.items():
                if base not in self._checked:
                    await self._check(base, list(logical_paths))
                    self._checked.add(base)

    async def _check(self, base: str, logical_paths: Sequence[str]) -> None:
        expected = self._bases.get(base)
        where = resolve_base(self._path, base)
        what = (
            f"the snapshot at {self._path!r} references base {base!r} ({where!r}) for "
            f"{describe_paths(logical_paths)}, but "
        )
        advice = (
            ". Its referenced bytes cannot be read: restore from another snapshot (keep the bases of incremental "
            "snapshots, or make self-contained copies with snapshotkit consolidate)"
        )
        if expected is None:
            raise BaseSnapshotError(what + "its manifest does not list that base; the manifest is corrupt" + advice)
        plugin, _ = self._route(f"{base}/{METADATA_FILENAME}")
        try:
            text = await plugin.read(METADATA_FILENAME)
        except FileNotFoundError as exc:
            raise BaseSnapshotError(what + "no snapshot is there any more (it was deleted)" + advice) from exc
        except Exception as exc:
            raise storage_failure(exc, location=f"{base}/{METADATA_FILENAME}", logical_paths=logical_paths)  # noqa: B904
        try:
            found = SnapshotMetadata.from_text(bytes(text)).snapshot_id
        except SnapshotkitError as exc:
            raise BaseSnapshotError(what + f"its manifest is damaged ({exc})" + advice) from exc
        if found != expected:
            raise BaseSnapshotError(
                what + f"the snapshot there now has id {found!r}, not {expected!r}: it was replaced by another "
                "snapshot of the same name" + advice
            )

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        plugin, inner = self._route(location)
        return await plugin.read(inner, byte_range)

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        plugin, inner = self._route(location)
        await plugin.read_into(inner, start, buffers)

    async def prefetch(self, location: str, byte_range: ByteRange) -> None:
        # only this snapshot's own objects: a base is opened (and its id checked) by a read alone
        if not any(location.startswith(base + "/") for base in self._bases):
            await self._plugin.prefetch(location, byte_range)

    async def write(self, location: str, data: object) -> None:
        raise PermissionError(f"{location}: a snapshot's read-side storage does not write")

    async def delete(self, location: str) -> None:
        raise PermissionError(f"{location}: a snapshot's read-side storage does not delete")

    async def close(self) -> None:
        opened, self._opened = list(self._opened.values()), {}
        try:
            for plugin in opened:
                await plugin.close()
        finally:
            await self._plugin.close()


def open_snapshot_storage(path: str, storage_options: Mapping[str, object], bases: Mapping[str, str]) -> StoragePlugin:
    """The storage to read the snapshot at ``path`` from: its plugin, wrapped in a
    :class:`ReferencingStorage` when its manifest has ``bases``."""
    options = dict(storage_options)
    plugin = open_storage_plugin(path, options)
    if not bases:
        return plugin
    return ReferencingStorage(plugin, path, bases, lambda where: open_storage_plugin(where, options))


def intact_bases(path: str, bases: Mapping[str, str], storage_options: Mapping[str, object]) -> frozenset[str]:
    """The base locations among ``bases`` (of the snapshot at ``path``) that still hold the snapshot
    of the referenced id: a take against this snapshot may copy its references to those (a
    reference to a base that is gone or replaced is written again instead)."""
    options = dict(storage_options)
    intact = set()
    for location, snapshot_id in bases.items():
        where = resolve_base(path, location)
        try:
            found = load_metadata(lambda where=where: open_storage_plugin(where, options), where)  # type: ignore[misc]
        except SnapshotkitError:
            continue
        if found.snapshot_id == snapshot_id:
            intact.add(location)
    return frozenset(intact)


def needed_bases(items: Iterable[tuple[Piece, str]]) -> dict[str, set[str]]:
    """Base location -> the logical paths whose pieces (``(piece, logical path)`` pairs) it holds."""
    needed: dict[str, set[str]] = {}
    for piece, logical_path in items:
        if piece.base is not None:
            needed.setdefault(piece.base, set()).add(logical_path)
    return needed


async def check_referenced(plugin: StoragePlugin, items: Iterable[tuple[Piece, str]]) -> None:
    """Check the bases the pieces of ``items`` reference, before any of their bytes is read.

    Raises:
        BaseSnapshotError: see :meth:`ReferencingStorage.check_bases`; also when pieces reference
            bases but ``plugin`` was opened without them.
    """
    needed = needed_bases(items)
    if not needed:
        return
    if not isinstance(plugin, ReferencingStorage):
        first = next(iter(needed))
        raise BaseSnapshotError(
            f"pieces of {describe_paths(needed[first])} are in base {first!r}, but this reader was opened without the "
            "snapshot's bases; open it through snapshotkit.Snapshot"
        )
    await plugin.check_bases(needed)
