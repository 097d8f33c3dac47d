"""A manager's root: which ``step_<n>`` snapshots are committed, which are leftovers, what they hold.

The root is read through its storage plugin's listing (one ``list`` call; object stores page
through it). Names are the only thing trusted from a listing; what a committed snapshot is
(its step, its metrics, whether a manager wrote it) comes from its manifest, whose integrity
line is verified like any restore's.

IMPORTANT: only objects whose names snapshotkit itself writes (data objects, the manifest and
its temporary) are ever deleted, and a directory holding anything else is left alone, so a
foreign checkpoint (DCP, a user's files) that happens to sit under ``step_<n>`` survives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, OWN_OBJECT
from snapshotkit._lifecycle.retention import StepRecord
from snapshotkit.errors import ManifestError, SnapshotkitError
from snapshotkit.storage import StoragePlugin

#: The user-metadata key under which a manager records step, metrics and reason.
MANAGER_KEY = "snapshotkit.manager"

_STEP_DIR = re.compile(r"step_(0|[1-9][0-9]*)")


def step_dir(step: int) -> str:
    """The directory (location prefix, no slash) of ``step``'s snapshot below the root."""
    return f"step_{step}"


def step_of(name: str) -> int | None:
    """The step of the directory ``name`` below the root (``"step_10"`` -> 10); None for any other name."""
    match = _STEP_DIR.fullmatch(name)
    return int(match.group(1)) if match is not None else None


@dataclasses.dataclass(frozen=True)
class StepObjects:
    """The objects below one ``step_<n>`` directory of the root.

    Attributes:
        step: ``n``.
        locations: every object below it, relative to the root, sorted.
    """

    step: int
    locations: tuple[str, ...]

    @property
    def committed(self) -> bool:
        """Whether the manifest is there (the take committed)."""
        return f"{step_dir(self.step)}/{METADATA_FILENAME}" in self.locations

    @property
    def only_ours(self) -> bool:
        """Whether every object is one a take writes (so removing them removes nothing foreign)."""
        prefix = step_dir(self.step) + "/"
        return all(OWN_OBJECT.fullmatch(location.removeprefix(prefix)) for location in self.locations)


@dataclasses.dataclass(frozen=True)
class RootListing:
    """The ``step_<n>`` directories of a root, by step."""

    steps: Mapping[int, StepObjects]

    @property
    def committed(self) -> list[int]:
        """Steps with a committed snapshot, ascending."""
        return sorted(step for step, objects in self.steps.items() if objects.committed)

    @property
    def incomplete(self) -> list[int]:
        """Steps with objects but no manifest (a take that never committed, or a deletion cut short)."""
        return sorted(step for step, objects in self.steps.items() if not objects.committed)


def parse_listing(locations: Sequence[str]) -> RootListing:
    """Group a root's listing by ``step_<n>`` directory; every other entry is ignored."""
    grouped: dict[int, list[str]] = {}
    for location in locations:
        head, slash, _ = location.partition("/")
        match = _STEP_DIR.fullmatch(head)
        if slash and match is not None:
            grouped.setdefault(int(match.group(1)), []).append(location)
    return RootListing({step: StepObjects(step, tuple(sorted(found))) for step, found in grouped.items()})


async def list_root(plugin: StoragePlugin) -> RootListing:
    """List the root ``plugin`` serves."""
    return parse_listing(await plugin.list(""))


async def _holds_only_take_dirs(plugin: StoragePlugin, step: int) -> bool:
    """Whether the directories below ``step``'s are at most the ``data/`` a take creates."""
    top = step_dir(step) + "/"
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
        match = _STEP_DIR.fullmatch(name)
        if match is None or int(match.group(1)) in listing.steps:
            continue
        if await _holds_only_take_dirs(plugin, int(match.group(1))):
            steps.append(int(match.group(1)))
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
    """Delete what a take wrote below ``objects.step``, crash-safely.

    The manifest goes first, so a deletion cut short leaves a directory that never opens as a
    snapshot (and that the next clean-up removes). Objects a take does not write stay, and so do
    directories it does not create.
    """
    prefix = step_dir(objects.step) + "/"
    manifest = prefix + METADATA_FILENAME
    if manifest in objects.locations:
        with contextlib.suppress(FileNotFoundError):
            await plugin.delete(manifest)
    if objects.only_ours:
        await plugin.delete_prefix(prefix)
    else:
        await plugin.discard([loc for loc in objects.locations if OWN_OBJECT.fullmatch(loc.removeprefix(prefix))])
    if plugin.capabilities.directories and await _holds_only_take_dirs(plugin, objects.step):
        await plugin.remove_empty_dirs(prefix)
