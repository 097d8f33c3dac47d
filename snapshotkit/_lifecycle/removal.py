"""Removing one snapshot by its path (not a manager's step): the manifest first, then its data.

The snapshot's parent is opened as the root and the snapshot's directory is deleted through the
same crash-safe sequence a manager's retention uses (:func:`~snapshotkit._lifecycle.catalog.delete_snapshot_dir`):
a removal cut short leaves objects that never open as a snapshot, and anything a take does not
write stays.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from snapshotkit import _events
from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT
from snapshotkit._lifecycle.catalog import delete_snapshot_dir
from snapshotkit._lifecycle.janitor import run_on_root
from snapshotkit.errors import ConfigError
from snapshotkit.storage import StoragePlugin

__all__ = ["remove_snapshot", "split_snapshot_path"]

_log = logging.getLogger("snapshotkit.manager")


def split_snapshot_path(path: str) -> tuple[str, str]:
    """``path`` as the root that holds it and its name there: ``s3://b/run/last.ckpt`` ->
    ``("s3://b/run", "last.ckpt")``; a local path is made absolute first.

    Raises:
        ConfigError: ``path`` has no parent to hold it (``s3://bucket``, ``/``).
    """
    scheme, sep, rest = path.partition("://")
    if not sep:
        parent, name = os.path.split(os.path.abspath(path))
        if name:
            return parent, name
    else:
        head, slash, name = rest.rstrip("/").rpartition("/")
        if slash and head and name:
            return f"{scheme}://{head}", name
    raise ConfigError(
        f"{path!r} names no snapshot below a folder or bucket; pass the snapshot's own path (e.g. "
        "'checkpoints/last.ckpt' or 's3://bucket/run/last.ckpt')"
    )


def remove_snapshot(path: str, storage_options: Mapping[str, Any]) -> bool:
    """Delete the snapshot at ``path`` (committed, or the leftovers of a take that never
    committed), manifest first; whether there was anything of a snapshot's to delete.

    Raises:
        ConfigError: see :func:`split_snapshot_path`.
        StorageError: the store failed (naming ``path``; the failure is the cause).
    """
    root, name = split_snapshot_path(path)
    started = time.perf_counter()

    async def remove(plugin: StoragePlugin) -> tuple[bool, int]:
        prefix = name + "/"
        locations = await plugin.list(prefix)
        ours = [loc for loc in locations if OWN_OBJECT.fullmatch(loc.removeprefix(prefix))]
        if not ours:
            return False, 0
        await delete_snapshot_dir(plugin, name, locations)
        return prefix + METADATA_FILENAME in locations, len(ours)

    committed, count = run_on_root(root, storage_options, remove, f"removing the snapshot {path!r}")
    if count:
        seconds = time.perf_counter() - started
        what = "deleted the snapshot" if committed else "removed the incomplete snapshot"
        _log.info("%s %s (%d objects) in %.2f s", what, path, count, seconds)
        _events.emit("snapshot_deleted" if committed else "incomplete_removed", path=path, rank=0, seconds=seconds)
    return count > 0
