"""A manager's root: which ``step_<n>`` snapshots are committed, which are leftovers, what they hold.

The root is read through its storage plugin's listing (one ``list`` call; object stores page
through it). Names are the only thing trusted from a listing; what a committed snapshot is
(its step, its metrics, whether a manager wrote it) comes from its manifest, whose integrity
line is verified like any restore's. What the names say (the ``step_<n>`` directories, which are
committed, a snapshot at the root itself) is :mod:`snapshotkit._format.steps`'s to read.

IMPORTANT: only objects whose names snapshotkit itself writes (data objects, the manifest and
its temporary) are ever deleted, and a directory holding anything else is left alone, so a
foreign checkpoint (DCP, a user's files) that happens to sit under ``step_<n>`` survives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT
from snapshotkit._format.steps import RootListing, StepObjects, parse_listing, step_dir, step_of
from snapshotkit._lifecycle.retention import StepRecord
from snapshotkit.errors import ManifestError, SnapshotkitError
from snapshotkit.storage import StoragePlugin

#: The user-metadata key under which a manager records step, metrics and reason.
MANAGER_KEY = "snapshotkit.manager"


async def list_root(plugin: StoragePlugin) -> RootListing:
    """List the root ``plugin`` serves."""
    return parse_listing(await plugin.list(""))


async def _holds_only_take_dirs(plugin: StoragePlugin, directory: str) -> bool:
    """Whether the directories below ``directory`` (a location prefix, no slash) are at most
    the ``data/`` a take creates."""
    top = directory + "/"
    subdirs = await plugin.list_dirs(top)
    if any(d != top + "data" for d in subdirs):
        return False
    return not subdirs or not await plugin.list_dirs(top + "data/")


async def empty_step_dirs(plugin: StoragePlugin, listing: RootListing) -> list[int]:
    """Steps whose directory holds no object, only (at most) the empty ``data/`` a take creates:
    a file system's leftover of a take killed before its first file. None on stores without
    directories. A directory holding anything else (a user's empty folders) is not listed."""
    if not plugin.capabilities.directories:
        return []
    steps = []
    for name in await plugin.list_dirs(""):
        step = step_of(name)
        if step is None or step in listing.steps:
            continue
        if await _holds_only_take_dirs(plugin, step_dir(step)):
            steps.append(step)
    return sorted(steps)


def manager_record(step: int, user_metadata: Mapping[str, Any]) -> StepRecord | None:
    """The record a manager left in a snapshot's user metadata, or None if no manager wrote it
    (or wrote it for another step: a copied or renamed snapshot is not this step's)."""
    raw = user_metadata.get(MANAGER_KEY)
    if not isinstance(raw, Mapping) or raw.get("step") != step or type(raw.get("step")) is not int:
        return None
    metrics = raw.get("metrics", {})
    if not isinstance(metrics, Mapping):
        return None
    clean: dict[str, float | None] = {}
    for name, value in metrics.items():
        clean[str(name)] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return StepRecord(step, clean)


async def read_metadata(plugin: StoragePlugin, step: int) -> SnapshotMetadata | None:
    """The manifest of ``step``'s committed snapshot, read and verified now; None if it is gone
    or fails its checks. A storage failure is raised: "unknown" must not pass for "gone"."""
    try:
        document = await plugin.read(f"{step_dir(step)}/{METADATA_FILENAME}")
    except FileNotFoundError as exc:
        if isinstance(exc, SnapshotkitError):  # BucketNotFoundError: the store is missing, not the step
            raise
        return None
    try:
        return SnapshotMetadata.from_text(bytes(document))
    except ManifestError:
        return None


async def read_record(plugin: StoragePlugin, step: int) -> StepRecord | None:
    """The manager record of ``step``'s committed snapshot, read now; None if a manager did not
    write it, or its manifest is gone or fails its checks (then it is never the manager's to
    delete). A storage failure is raised."""
    metadata = await read_metadata(plugin, step)
    return manager_record(step, metadata.user_metadata) if metadata is not None else None


async def delete_snapshot(plugin: StoragePlugin, objects: StepObjects) -> None:
    """Delete what a take wrote below ``objects.step``, crash-safely (see :func:`delete_snapshot_dir`)."""
    await delete_snapshot_dir(plugin, step_dir(objects.step), objects.locations)


async def delete_snapshot_dir(plugin: StoragePlugin, directory: str, locations: Sequence[str]) -> None:
    """Delete what a take wrote below ``directory`` (a location prefix of ``plugin``, no slash),
    crash-safely; ``locations`` are every object below it (a listing of ``directory + "/"``).

    The manifest goes first, so a deletion cut short leaves a directory that never opens as a
    snapshot (and that the next clean-up removes). Objects a take does not write stay, and so do
    directories it does not create.
    """
    prefix = directory + "/"
    manifest = prefix + METADATA_FILENAME
    if manifest in locations:
        with contextlib.suppress(FileNotFoundError):
            await plugin.delete(manifest)
    if all(OWN_OBJECT.fullmatch(location.removeprefix(prefix)) for location in locations):
        await plugin.delete_prefix(prefix)
    else:
        await plugin.discard([loc for loc in locations if OWN_OBJECT.fullmatch(loc.removeprefix(prefix))])
    if plugin.capabilities.directories and await _holds_only_take_dirs(plugin, directory):
        await plugin.remove_empty_dirs(prefix)
