"""The restore side: open the manifest, plan the reads, fetch, place, load.

manifest (:func:`load_metadata`)  ->  plan reads for the leaves wanted (:mod:`.plan`, :mod:`.load`)
->  fetch byte ranges under the budget (:mod:`.fetch`)  ->  place into the destinations
->  ``load_state_dict()`` (RNG last)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapshotkit._app_state import validate_app_state
from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME, Entry, TensorEntry
from snapshotkit._plan.flatten import inflate
from snapshotkit._restore.fetch import check_extents, read_pieces
from snapshotkit._restore.place import LeafLoader, describe_mismatch, tensor_matches
from snapshotkit._restore.plan import close_matches, missing_key_hint, plan_restore, rank_view, subtree
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit.errors import (
    BucketNotFoundError,
    IncompleteSnapshotError,
    LogicalPathNotFoundError,
    ManifestError,
    SnapshotNotFoundError,
)
from snapshotkit.storage import StoragePlugin

OpenPlugin = Callable[[], StoragePlugin]


def load_metadata(open_plugin: OpenPlugin, path: str) -> SnapshotMetadata:
    """Read and decode the manifest of the snapshot at ``path``.

    Raises:
        SnapshotNotFoundError: nothing is at the path.
        IncompleteSnapshotError: data is there but the take never committed.
        ManifestError: the manifest is malformed or from a newer format version.
    """
    with gc_paused():
        return run_sync(_load_metadata(open_plugin(), path))


async def _load_metadata(plugin: StoragePlugin, path: str) -> SnapshotMetadata:
    try:
        try:
            text = await plugin.read(METADATA_FILENAME)
        except BucketNotFoundError:
            raise
        except FileNotFoundError:
            leftovers: list[str] = []
            if plugin.capabilities.listing:
                leftovers = await plugin.list("")
            if leftovers:
                raise IncompleteSnapshotError(
                    f"{path!r} holds {len(leftovers)} object(s) but no {METADATA_FILENAME}: the take that "
                    "wrote it never committed (it failed or was interrupted), so it is not a snapshot. "
                    "Restore from an earlier snapshot and delete this path"
                ) from None
            raise SnapshotNotFoundError(
                f"no snapshot at {path!r} (no {METADATA_FILENAME} there); check the path"
            ) from None
    finally:
        await plugin.close()
    try:
        return SnapshotMetadata.from_text(bytes(text))
    except ManifestError as exc:
        raise type(exc)(f"{path}/{METADATA_FILENAME}: {exc}") from None


def _fetch(open_plugin: OpenPlugin, loader: LeafLoader, config: Config) -> None:
    async def run() -> None:
        plugin = open_plugin()
        try:
            await check_extents(plugin, loader.claims, io_concurrency=config.io_concurrency)
            loader.allocate()
            await read_pieces(
                plugin,
                loader.reads,
                budget=MemoryBudget(config.memory_budget_bytes),
                io_concurrency=config.io_concurrency,
                verify=config.verify_checksums,
            )
        finally:
            await plugin.close()

    run_sync(run())


def restore(
    metadata: SnapshotMetadata,
    app_state: object,
    *,
    path: str,
    open_plugin: OpenPlugin,
    group: Group,
    config: Config,
    strict: bool,
    weights_only: bool,
) -> None:
    """Load the snapshot into ``app_state`` on every rank of ``group``: every rank restored, or
    every rank raises (nobody trains on from a half-restored state)."""
    error: BaseException | None = None
    try:
        _restore_rank(metadata, app_state, path, open_plugin, group.rank, config, strict, weights_only)
    except Exception as exc:
        error = exc
    group.exchange(None, error, "restore: loading the state")


def _restore_rank(
    metadata: SnapshotMetadata,
    app_state: object,
    path: str,
    open_plugin: OpenPlugin,
    rank: int,
    config: Config,
    strict: bool,
    weights_only: bool,
) -> None:
    states_of = validate_app_state(app_state)
    loader = LeafLoader(weights_only=weights_only)
    with gc_paused():
        steps = plan_restore(
            rank_view(metadata, rank),
            states_of,
            strict=strict,
            loader=loader,
            snapshot_path=path,
            hint=lambda key: missing_key_hint(metadata, key, rank),
        )
        _fetch(open_plugin, loader, config)
    for step in steps:
        step()


def read_object(
    metadata: SnapshotMetadata,
    logical_path: str,
    obj_out: Any,
    *,
    path: str,
    open_plugin: OpenPlugin,
    rank: int,
    config: Config,
    weights_only: bool,
) -> Any:
    """One value (or a container's whole subtree) by logical path, reading nothing else."""
    view, logical = _resolve_logical_path(metadata, logical_path, rank, path)
    entry = view[logical]
    loader = LeafLoader(weights_only=weights_only)
    if isinstance(entry, TensorEntry) and obj_out is not None:
        import torch

        if isinstance(obj_out, torch.Tensor) and not tensor_matches(entry, obj_out):
            raise describe_mismatch(logical, entry, obj_out)
    containers, leaves = subtree(view, logical)
    with gc_paused():
        if containers:
            thunks = {p: loader.add(p, e) for p, e in leaves.items()}
        else:
            thunks = {logical: loader.add(logical, entry, obj_out)}
        _fetch(open_plugin, loader, config)
    return inflate(logical, containers, {p: thunk() for p, thunk in thunks.items()})


def _resolve_logical_path(
    metadata: SnapshotMetadata, logical_path: str, rank: int, path: str
) -> tuple[dict[str, Entry], str]:
    """The rank view and logical path ``logical_path`` names; ``"<rank>/..."`` selects that rank's view."""
    view = rank_view(metadata, rank)
    if logical_path in view:
        return view, logical_path
    head, _, rest = logical_path.partition("/")
    if head.isdigit() and rest:
        prefixed_view = rank_view(metadata, int(head))
        if rest in prefixed_view:
            return prefixed_view, rest
    raise LogicalPathNotFoundError(
        f"logical path {logical_path!r} is not in the snapshot at {path!r}{close_matches(logical_path, view)}. "
        "List the paths with Snapshot(path).get_manifest()"
    )
