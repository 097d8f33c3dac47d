"""Takes whose commit belongs to someone else: each process writes its part, one process commits.

DCP's storage layer splits a save this way: every rank writes its own write items
(``write_data``), DCP gathers what they return, and one rank finishes (``finish``). Each rank's
part is a take of its own on a group of one (no collective of snapshotkit's: DCP's exchange is
the rendezvous): :func:`write_part` stages and writes through the same stager, inline writer and
layout as ``take``, and returns the manifest entries of what it wrote without committing them;
:func:`commit_parts` merges every part's entries and writes the manifest exclusively, last.

IMPORTANT: a part that fails deletes what it wrote before raising. Parts that succeeded keep
their data objects until :func:`commit_parts` runs; if it never runs (another part failed, and
DCP skips its finish step) they stay as an incomplete snapshot without a manifest, which
``SnapshotManager`` and ``snapshotkit cleanup`` remove. A manifest write that did not take
effect deletes every part's data objects.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._config import Config
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry
from snapshotkit._plan.merge import finish_rank, merge_parts, merge_results
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit._take.commit import CommitPlan, build_metadata, discard, discard_at, write_manifest
from snapshotkit._take.engine import stage_and_submit, wait_for_writes
from snapshotkit._take.prepare import PreparedTake
from snapshotkit._take.writers import InlineWriter, Target
from snapshotkit.storage import open_storage_plugin

logger = logging.getLogger("snapshotkit.take")


@dataclasses.dataclass(frozen=True)
class WrittenPart:
    """What one process wrote of a snapshot, not committed yet (picklable, no tensors).

    Attributes:
        entries: its manifest entries (``"0/<logical path>"`` keys).
        locations: the data objects it wrote.
        base_ids: base location -> snapshot id of every base its pieces may reference.
        written_bytes: the bytes of the pieces it wrote (an incremental part's references excluded).
    """

    entries: Mapping[str, Entry]
    locations: tuple[str, ...]
    base_ids: Mapping[str, str]
    written_bytes: int


def write_part(prepared: PreparedTake, *, config: Config, storage_options: Mapping[str, Any]) -> WrittenPart:
    """Stage and write ``prepared`` (a take planned on a group of one) and return its part.

    On any failure, the data objects it wrote are deleted before the error is raised.
    """
    options = dict(storage_options)
    bases = prepared.reuse.bases if prepared.reuse is not None else {}
    layouts = prepared.local.sharded_layouts()
    commit = CommitPlan(prepared.path, options, prepared.plan, prepared.decision, layouts, 1, {}, bases)
    writer = InlineWriter()
    target = Target(prepared.path, options, prepared.reuse)
    submitted: list[Any] = []
    try:
        with gc_paused():
            submitted, error = stage_and_submit(prepared, writer, target, config, ByteProgress("", enabled=False))
        pieces, error = wait_for_writes(submitted, error, prepared.path, prepared.plan)
        if error is not None:
            raise error
        with gc_paused():
            entries = merge_results([finish_rank(prepared.plan, pieces)], prepared.decision, layouts)
    except BaseException:
        discard(commit, [item.plan.location for item in submitted])
        raise
    finally:
        writer.release(target)
    written = sum(piece.nbytes for piece in pieces.values() if piece.base is None)
    return WrittenPart(entries, tuple(item.plan.location for item in submitted), dict(bases), written)


def commit_parts(
    path: str, storage_options: Mapping[str, Any], parts: Sequence[WrittenPart], user_metadata: Mapping[str, Any]
) -> SnapshotMetadata:
    """Merge the parts into one manifest and write it exclusively: the commit.

    Raises:
        UnsupportedValueError: the parts disagree (see :func:`~snapshotkit._plan.merge.merge_parts`);
            nothing is committed and every part's data objects are deleted.
        SnapshotExistsError: a snapshot was committed at ``path`` meanwhile.
        StorageError: the store failed (the plugin's error is the cause).
    """
    options = dict(storage_options)
    locations = [location for part in parts for location in part.locations]
    try:
        with gc_paused():
            manifest = merge_parts([part.entries for part in parts])
            base_ids = {location: id_ for part in parts for location, id_ in part.base_ids.items()}
            metadata = build_metadata(manifest, 1, user_metadata, base_ids)
            document = metadata.to_bytes()
    except BaseException:
        discard_at(path, options, locations)
        raise
    try:
        run_sync(_write_and_close(path, options, document))
    except BaseException as exc:
        try:
            stored = run_sync(_read_and_close(path, options))
        except BaseException:
            logger.warning("the manifest write at %s failed and could not be read back; data kept", path)
            raise exc from None
        if stored == document:  # the write took effect (a lost response): committed
            logger.warning("the manifest at %s was written although the store reported an error: %s", path, exc)
            return metadata
        discard_at(path, options, locations)
        raise
    return metadata


async def _write_and_close(path: str, options: Mapping[str, Any], document: bytes) -> None:
    plugin = open_storage_plugin(path, dict(options))
    try:
        await write_manifest(plugin, document, path, writer="DCP save")
    finally:
        await plugin.close()


async def _read_and_close(path: str, options: Mapping[str, Any]) -> bytes | None:
    plugin = open_storage_plugin(path, dict(options))
    try:
        return bytes(await plugin.read(METADATA_FILENAME))
    except FileNotFoundError:
        return None
    finally:
        await plugin.close()
