"""A take that replaces the snapshot at its path: the path opens as the old snapshot or the new one.

IMPORTANT: the old snapshot is never deleted before the new one is committed. A replacing take
differs from a take to a fresh path in three places only:

1. rank 0 does not refuse a path that holds a snapshot (it still refuses a folder of
   ``step_<n>`` snapshots, and a ``base=`` that is the path itself: replacing the base would
   break the new snapshot), notes which manifest is there (:func:`manifest_digest`) and lists
   the data objects already there (:func:`stale_objects`);
2. the data objects it writes sit beside the old ones (their names carry the take id, so they
   never collide). Just before the commit rank 0 checks that the manifest is still the one it
   noted (:func:`refuse_replaced_meanwhile`: a take that committed there meanwhile may have
   deleted this one's data objects), then writes the manifest, the commit marker, with the
   plugin's atomic :meth:`~snapshotkit.storage.StoragePlugin.replace` instead of
   ``write_exclusive``: until it takes effect the old manifest is there, whole, and the old
   snapshot opens; from then on the new one does. The commit read-back tells the two apart by
   comparing bytes (old bytes there: not committed, and only the new take's data objects are
   deleted);
3. once committed, rank 0 deletes the objects listed in step 1 that the new manifest does not
   reference, and the temporary files of manifest writes that were killed (:func:`sweep`,
   best effort). A crash before that leaves unreferenced objects inside a committed snapshot:
   nothing reads them (verify, info and restore follow the manifest), and the next replacing
   take at the path deletes them.

Replacing takes to one path must not overlap: the sweep of one deletes what the other wrote
before it was listed (``SnapshotCheckpointIO`` waits for a pending save to a path before the
next). The check before the commit refuses the later of two that overlap, except in the instant
between that check and the write. A reader that opened the old snapshot before the commit may
find its data objects gone once the sweep ran: it opens the path again. A snapshot that others
use as their ``base=`` must not be replaced: they reference its data objects, which the sweep
deletes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT, pieces_of
from snapshotkit._runtime.loop import run_sync
from snapshotkit._text import first_few
from snapshotkit.errors import Advice, ConfigError, SnapshotExistsError
from snapshotkit.storage import StoragePlugin, open_storage_plugin

logger = logging.getLogger("snapshotkit.take")

_DATA = "data/"


async def stale_objects(plugin: StoragePlugin) -> tuple[str, ...]:
    """The data objects at the path before a replacing take writes, and the temporary files of
    manifest writes that were killed (what its sweep may delete); none where the store cannot list."""
    if not plugin.capabilities.listing:
        return ()
    found = [*await plugin.list(_DATA), *await plugin.list(f"{METADATA_FILENAME}.tmp-")]
    return tuple(loc for loc in found if OWN_OBJECT.fullmatch(loc))


async def manifest_digest(plugin: StoragePlugin) -> str:
    """The SHA-256 of the manifest at the path, ``""`` when there is none."""
    try:
        document = bytes(await plugin.read(METADATA_FILENAME))
    except FileNotFoundError:
        return ""
    return hashlib.sha256(document).hexdigest()


async def refuse_replaced_meanwhile(plugin: StoragePlugin, path: str, digest: str) -> None:
    """Raise if the manifest at ``path`` is no longer the one a replacing take found there
    (``digest``, from :func:`manifest_digest`): another take committed there meanwhile.

    Raises:
        SnapshotExistsError: it changed; the take must not commit (its data is deleted).
    """
    if await manifest_digest(plugin) != digest:
        problem = (
            f"another take committed a snapshot at {path!r} while this take, replacing the snapshot there, was "
            "writing; this take's data was discarded"
        )
        error = SnapshotExistsError(f"{problem}. Replacing takes to one path must not overlap: wait for the first")
        raise error.advised(Advice(problem, "new_destination", (path,)))


def refuse_own_base(path: str, base_path: str) -> None:
    """Raise if a replacing take to ``path`` is incremental against ``path`` itself.

    Raises:
        ConfigError: it is (before anything is written).
    """
    if _key(base_path) == _key(path):
        raise ConfigError(
            f"the take replacing the snapshot at {path!r} has that snapshot as its base=: the new snapshot would "
            "reference the data objects the replace deletes. Nothing was written; take a full snapshot (no base=), "
            "or take to another path"
        )


def _key(path: str) -> str:
    return path.rstrip("/") if "://" in path else os.path.realpath(path)


def unreferenced(stale: Sequence[str], metadata: SnapshotMetadata) -> list[str]:
    """The objects of ``stale`` that ``metadata`` (the committed manifest) does not reference."""
    referenced = {
        piece.location for entry in metadata.manifest.values() for piece in pieces_of(entry) if piece.base is None
    }
    return [location for location in stale if location not in referenced]


def sweep(path: str, storage_options: Mapping[str, Any], stale: Sequence[str], metadata: SnapshotMetadata) -> None:
    """After a replacing take committed ``metadata`` at ``path``: delete the objects of ``stale``
    (listed before it wrote) that the new manifest does not reference. Never raises: what could
    not be deleted is logged, and the next replacing take deletes it."""
    doomed = unreferenced(stale, metadata)
    if not doomed:
        return

    async def run() -> None:
        plugin = open_storage_plugin(path, dict(storage_options))
        try:
            await plugin.discard(doomed)
        finally:
            await plugin.close()

    try:
        run_sync(run())
    except Exception as exc:
        logger.warning(
            "replaced the snapshot at %s, but could not delete the %d data object(s) of the snapshot it replaced "
            "(%s): %s: %s. The new snapshot is committed and whole; the next take replacing it deletes them",
            path,
            len(doomed),
            first_few(doomed, show=str),
            type(exc).__name__,
            exc,
        )
