"""A root of ``step_<n>`` snapshots as ``snapshotkit ls`` shows it: one summary per step directory.

The root is listed once through the lifecycle catalog (the listing the snapshot manager uses)
and each committed snapshot's manifest is read, verified and decoded; nothing else is read.
A snapshot's size is its manifest plus its data objects, each as long as the end of its last
piece (a take writes them so), since the storage SPI has no size call; an incomplete snapshot
has no manifest to say, so its size is unknown.

A snapshot at the root itself beside the steps (a take into the root instead of into a step) is
a stray: ``ls`` reports it, and ``info`` on the root describes the folder instead of it
(:func:`refuse_stray_at_root`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.steps import parse_listing, step_dir
from snapshotkit._inspect.pieces import data_object_bytes
from snapshotkit._lifecycle.catalog import MANAGER_KEY, empty_step_dirs, manager_record
from snapshotkit._lifecycle.janitor import run_on_root
from snapshotkit._restore.absent import not_found
from snapshotkit._runtime.loop import gather_or_cancel
from snapshotkit.errors import ManifestError, SnapshotNotFoundError
from snapshotkit.storage import StoragePlugin

#: Manifests read at once.
_READ_CONCURRENCY = 8


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """One ``step_<n>`` directory of a root.

    Attributes:
        step: ``n``.
        path: the snapshot's path (``<root>/step_<n>``).
        status: ``"complete"`` (committed, manifest verified), ``"incomplete"`` (objects but no
            manifest: a take that never committed, or a deletion cut short) or ``"damaged"``
            (the manifest fails its integrity check or is malformed; see ``error``).
        created_at: when the take committed (ISO 8601, UTC); None unless complete.
        size_bytes: the manifest and data objects (its own: not what an incremental snapshot reads
            from its bases); None unless complete.
        user_metadata: the take's ``metadata=`` without the manager's record; None unless complete.
        metrics: the metrics a manager saved with it; None if no manager wrote it.
        reason: why the manager saved it (``"interval"``, ``"preemption"``, ``"manual"``), or None.
        error: why a damaged manifest could not be read.
        bases: the base locations (``"../step_10"``) an incremental snapshot reads reused pieces
            from, sorted; ``()`` for a full snapshot; None unless complete.
    """

    step: int
    path: str
    status: str
    created_at: str | None = None
    size_bytes: int | None = None
    user_metadata: dict[str, Any] | None = None
    metrics: dict[str, float | None] | None = None
    reason: str | None = None
    error: str | None = None
    bases: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class RootSummary:
    """The step snapshots under ``root``, ascending by step; ``is_snapshot``: the root is itself a snapshot."""

    root: str
    steps: tuple[StepSummary, ...]
    is_snapshot: bool


def summarize_root(root: str, storage_options: Mapping[str, Any] | None) -> RootSummary:
    """List ``root`` and read the manifest of every committed ``step_<n>`` snapshot below it.

    Raises:
        StorageError: listing or reading failed (the message names the root).
    """
    root = root.rstrip("/")
    return run_on_root(
        root, storage_options or {}, functools.partial(_summarize, root=root), f"listing the snapshots under {root!r}"
    )


def refuse_stray_at_root(path: str, storage_options: Mapping[str, Any] | None) -> None:
    """Raise if the snapshot at ``path`` is a stray: a snapshot taken into a folder of ``step_<n>``
    snapshots (a manager's root) instead of into a step. ``snapshotkit info`` then says what it says
    of a folder of snapshots, and mentions the stray. Costs one listing of ``path``.

    Raises:
        SnapshotNotFoundError: ``path`` is such a folder (the message names its snapshots).
        StorageError: listing failed (the message names the path).
    """
    path = path.rstrip("/")
    error = run_on_root(path, storage_options or {}, functools.partial(_stray_error, root=path), f"listing {path!r}")
    if error is not None:
        raise error


async def _stray_error(plugin: StoragePlugin, root: str) -> SnapshotNotFoundError | None:
    if not parse_listing(await plugin.list("")).stray_snapshot:
        return None
    folder = await not_found(plugin, root, ())
    return SnapshotNotFoundError(
        f"{folder}. It also holds a stray snapshot at {root!r} itself, beside the steps (a take into the folder "
        f"instead of into a step), which no SnapshotManager counts: `snapshotkit ls {root}` says how to move it "
        "into a step of its own"
    )


async def _summarize(plugin: StoragePlugin, root: str) -> RootSummary:
    locations = await plugin.list("")
    listing = parse_listing(locations)
    empty = await empty_step_dirs(plugin, listing)
    slots = asyncio.Semaphore(_READ_CONCURRENCY)

    async def committed(step: int) -> StepSummary:
        async with slots:
            return await _read_step(plugin, root, step)

    found = await gather_or_cancel([committed(step) for step in listing.committed])
    found.extend(StepSummary(step, f"{root}/{step_dir(step)}", "incomplete") for step in [*listing.incomplete, *empty])
    return RootSummary(root, tuple(sorted(found, key=lambda s: s.step)), listing.root_snapshot)


async def _read_step(plugin: StoragePlugin, root: str, step: int) -> StepSummary:
    path = f"{root}/{step_dir(step)}"
    try:
        text = bytes(await plugin.read(f"{step_dir(step)}/{METADATA_FILENAME}"))
    except FileNotFoundError:  # deleted since the listing
        return StepSummary(step, path, "incomplete")
    try:
        metadata = SnapshotMetadata.from_text(text)
    except ManifestError as exc:
        return StepSummary(step, path, "damaged", error=str(exc))
    user = {key: value for key, value in metadata.user_metadata.items() if key != MANAGER_KEY}
    record = manager_record(step, metadata.user_metadata)
    reason = None
    if record is not None:
        raw = metadata.user_metadata[MANAGER_KEY]
        reason = raw.get("reason") if isinstance(raw.get("reason"), str) else None
    return StepSummary(
        step=step,
        path=path,
        status="complete",
        created_at=metadata.created_at,
        size_bytes=len(text) + sum(_own_object_bytes(metadata).values()),
        user_metadata=user,
        metrics=dict(record.metrics) if record is not None else None,
        reason=reason,
        bases=tuple(sorted(metadata.bases)),
    )


def _own_object_bytes(metadata: SnapshotMetadata) -> dict[str, int]:
    """The sizes of the data objects the snapshot itself holds (a reused piece's object is in its base)."""
    return {address: n for address, n in data_object_bytes(metadata).items() if not address.startswith("../")}
