"""``consolidate_snapshot``: a self-contained copy of a snapshot, whose bytes no longer depend on its bases.

Every distinct piece of the source (its own and those an incremental snapshot references in its
bases) is copied byte for byte into new data objects of ``dst``, through the restore pipeline
(:func:`~snapshotkit._restore.fetch.read_pieces`: ranged reads, base snapshot ids checked before
their first byte is read, every CRC-32C verified). The manifest keeps every entry of every rank,
with its pieces pointing at the copies; the copy gets a new snapshot id and no ``bases``.

Memory: pieces are packed, in the order they are stored in the source, into data objects of at
most ``Config.data_object_bytes`` and at most a little under half the memory budget; one object
is read while the previous one is written, so about the budget is held at once. A single piece
larger than that is held whole (a data object is written in one call).

IMPORTANT: the copy commits as a take does (``snapshotkit/_take/commit.py``): every data object is
written first, the manifest last with the plugin's exclusive write. Any failure before that deletes
the data objects written, so nothing at ``dst`` opens as a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._config import Config, snapshot_path
from snapshotkit._format.checksum import content_hash
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import Entry, ObjectEntry, ShardedTensorEntry, TensorEntry, pieces_of
from snapshotkit._format.pieces import Piece
from snapshotkit._plan.layout import ALIGNMENT_BYTES, data_object_location
from snapshotkit._restore.bases import open_snapshot_storage
from snapshotkit._restore.fetch import Claim, PieceRead, check_extents, read_pieces
from snapshotkit._restore.metadata import load_metadata
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.loop import run_sync
from snapshotkit._runtime.progress import ByteProgress, check_progress
from snapshotkit._take.commit import build_metadata, storage_error, write_manifest
from snapshotkit._take.prepare import refuse_existing
from snapshotkit.errors import InvalidArgumentError
from snapshotkit.snapshot import Snapshot
from snapshotkit.storage import StoragePlugin, open_storage_plugin

#: A distinct stored piece: where it is (``Piece.address``), its byte range and checksum.
_PieceKey = tuple[str, tuple[int, int], str]


def _key(piece: Piece) -> _PieceKey:
    return piece.address, piece.byte_range, piece.checksum


@dataclasses.dataclass(frozen=True)
class _Copy:
    """A source piece, a logical path that holds it (for errors), and its offset in the new object."""

    piece: Piece
    logical_path: str
    offset: int


@dataclasses.dataclass(frozen=True)
class _DataObject:
    location: str
    copies: tuple[_Copy, ...]
    nbytes: int


def consolidate_snapshot(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    memory_budget_bytes: int | None = None,
    progress: bool = False,
) -> Snapshot:
    """Write a self-contained copy of the snapshot at ``src`` (incremental or not) to ``dst``.

    The copy holds the same manifest entries (every kind, every rank's, replicated flags, the
    take's ``user_metadata``) with every piece, the source's own and those it references in its
    bases, copied byte for byte into data objects of ``dst``; content hashes are kept (computed
    for a source older than format version 4). It has a new snapshot id and references no base,
    so deleting the bases of ``src`` afterwards leaves it readable. ``created_at`` is the time
    the copy committed.

    Args:
        src: the snapshot to copy: a directory or a storage URI, as for :class:`~snapshotkit.Snapshot`.
        dst: where the copy goes: any snapshot path or URI that does not hold a snapshot yet.
        storage_options: passed to the storage plugins of ``src``, its bases and ``dst``.
        memory_budget_bytes: host bytes the copy may hold at once (default as for restore). A
            single piece larger than about half of it is held whole.
        progress: show a bar of the bytes copied on stderr, once the copy has run 2 s.

    Returns:
        The :class:`~snapshotkit.Snapshot` at ``dst``.

    Raises:
        InvalidArgumentError: an argument of the wrong type.
        ConfigError: an empty path or a bad ``memory_budget_bytes``.
        SnapshotExistsError: ``dst`` already holds a snapshot (it is never overwritten).
        SnapshotNotFoundError, ManifestError: as for restore, about ``src``.
        BaseSnapshotError: a base ``src`` references is gone, damaged or was replaced.
        IntegrityError: a piece fails its checksum or a data object is missing or short; the
            message names a logical path stored there. Nothing is committed at ``dst``.
        StorageError: reading ``src`` or writing ``dst`` failed. Nothing is committed at ``dst``.
    """
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise InvalidArgumentError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
    check_progress(progress, "consolidate_snapshot")
    source_path, target_path = snapshot_path(src), snapshot_path(dst)
    options = dict(storage_options or {})
    config = Config.resolve(memory_budget_bytes=memory_budget_bytes)
    metadata = load_metadata(lambda: open_storage_plugin(source_path, options), source_path)
    budget_bytes = config.memory_budget_bytes
    gaps_bytes = max(budget_bytes // 8, 1)
    object_bytes = max(min(config.data_object_bytes, (budget_bytes - gaps_bytes) // 2), 1)
    objects = _layout(_distinct_pieces(metadata), object_bytes, uuid.uuid4().hex[:8])
    total_bytes = sum(obj.nbytes for obj in objects)
    with ByteProgress(f"consolidating {source_path}", enabled=progress, total_bytes=total_bytes) as bar:
        run_sync(_consolidate(metadata, source_path, target_path, options, objects, config, gaps_bytes, bar))
    return Snapshot(target_path, storage_options=options)


def _distinct_pieces(metadata: SnapshotMetadata) -> list[tuple[Piece, str]]:
    """Each distinct piece once (a tied or shared piece is copied once), with the first logical path
    that holds it, in the order the source stores them (so reads of one data object merge)."""
    found: dict[_PieceKey, tuple[Piece, str]] = {}
    for key, entry in metadata.manifest.items():
        # One rank: the logical path; several: the manifest key, which read_object accepts too.
        shown = key.partition("/")[2] if metadata.world_size == 1 else key
        for piece in pieces_of(entry):
            found.setdefault(_key(piece), (piece, shown))
    return sorted(found.values(), key=lambda item: (item[0].address, item[0].byte_range))


def _layout(pieces: Sequence[tuple[Piece, str]], object_bytes: int, take_id: str) -> list[_DataObject]:
    """Pieces packed into data objects of at most ``object_bytes`` (a larger piece alone), each
    piece starting at a multiple of ``ALIGNMENT_BYTES`` as a take places them."""
    objects: list[_DataObject] = []
    current: list[_Copy] = []
    offset = 0
    for piece, logical_path in pieces:
        start = -(-offset // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
        if current and start + piece.nbytes > object_bytes:
            objects.append(_DataObject(data_object_location(0, len(objects), take_id), tuple(current), offset))
            current, start = [], 0
        current.append(_Copy(piece, logical_path, start))
        offset = start + piece.nbytes
    if current:
        objects.append(_DataObject(data_object_location(0, len(objects), take_id), tuple(current), offset))
    return objects


async def _consolidate(
    metadata: SnapshotMetadata,
    source_path: str,
    target_path: str,
    options: Mapping[str, Any],
    objects: Sequence[_DataObject],
    config: Config,
    gaps_bytes: int,
    bar: ByteProgress,
) -> dict[_PieceKey, Piece]:
    target = _open(target_path, options)
    written: list[str] = []
    try:
        await refuse_existing(target, target_path, writer="consolidate")
        source = open_snapshot_storage(source_path, options, metadata.bases)
        try:
            # Every base checked and every data object proven long enough before a byte is written.
            claims = [Claim(c.logical_path, c.piece, False) for obj in objects for c in obj.copies if c.piece.nbytes]
            await check_extents(source, claims, io_concurrency=config.io_concurrency)
            copied = await _copy(source, target, target_path, objects, config, gaps_bytes, written, bar)
        finally:
            await source.close()
        manifest = {key: _rewrite(entry, copied) for key, entry in metadata.manifest.items()}
        document = build_metadata(manifest, metadata.world_size, metadata.user_metadata).to_bytes()
        await write_manifest(target, document, target_path, writer="consolidate")
    except BaseException:
        with contextlib.suppress(Exception):
            await target.discard(written)
        raise
    finally:
        await target.close()
    return copied


def _open(path: str, options: Mapping[str, Any]) -> StoragePlugin:
    try:
        return open_storage_plugin(path, dict(options))
    except Exception as exc:
        raise storage_error(exc, path, action="opening")  # noqa: B904 - the cause is set


async def _copy(
    source: StoragePlugin,
    target: StoragePlugin,
    target_path: str,
    objects: Sequence[_DataObject],
    config: Config,
    gaps_bytes: int,
    written: list[str],
    bar: ByteProgress,
) -> dict[_PieceKey, Piece]:
    """Read each data object's pieces (verified) into one buffer and write it, the write of one
    overlapping the reads of the next; returns source piece -> its copy."""
    copied: dict[_PieceKey, Piece] = {}
    budget = MemoryBudget(gaps_bytes)
    pending: asyncio.Task[None] | None = None

    async def write(obj: _DataObject, buffer: memoryview) -> None:
        written.append(obj.location)  # before the call: a partly written object is discarded too
        try:
            await target.write(obj.location, buffer)
        except Exception as exc:
            paths = [c.logical_path for c in obj.copies]
            raise storage_error(exc, target_path, location=obj.location, logical_paths=paths)  # noqa: B904

    try:
        for obj in objects:
            buffer = memoryview(bytearray(obj.nbytes))
            reads = [
                PieceRead(c.piece, c.logical_path, direct=buffer[c.offset : c.offset + c.piece.nbytes])
                for c in obj.copies
            ]
            on_bytes = bar.advance if bar.enabled else None
            await read_pieces(
                source, reads, budget=budget, io_concurrency=config.io_concurrency, verify=True, on_bytes=on_bytes
            )
            for c in obj.copies:
                end = c.offset + c.piece.nbytes
                digest = c.piece.hash or content_hash(buffer[c.offset : end])
                copied[_key(c.piece)] = Piece(obj.location, (c.offset, end), c.piece.checksum, digest)
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(write(obj, buffer))
            del buffer, reads
        if pending is not None:
            await pending
    except BaseException:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        raise
    return copied


def _rewrite(entry: Entry, copied: Mapping[_PieceKey, Piece]) -> Entry:
    """``entry`` with every piece replaced by its copy (containers and primitives unchanged)."""
    if isinstance(entry, TensorEntry):
        return dataclasses.replace(entry, pieces=tuple(copied[_key(p)] for p in entry.pieces))
    if isinstance(entry, ObjectEntry):
        return dataclasses.replace(entry, piece=copied[_key(entry.piece)])
    if isinstance(entry, ShardedTensorEntry):
        shards = tuple(
            dataclasses.replace(shard, pieces=tuple(copied[_key(p)] for p in shard.pieces)) for shard in entry.shards
        )
        return dataclasses.replace(entry, shards=shards)
    return entry
