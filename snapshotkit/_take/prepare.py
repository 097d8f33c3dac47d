"""Phase one of every take: collect and describe the state, exchange descriptions, plan.

Shared by ``take`` and ``async_take``; nothing is written yet (objects are serialized here).
Every rank ends with the same :class:`~snapshotkit._plan.decide.Decision` and its own
:class:`~snapshotkit._plan.rank_plan.TakePlan`. When the structure did not change since the last
take on the process group, the ranks agree on that in one small all-reduce and reuse that take's
plan instead of exchanging descriptions and planning (:mod:`snapshotkit._take.plan_cache`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from snapshotkit._app_state import validate_app_state
from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._format.steps import parse_listing, step_dir, step_of
from snapshotkit._format.user_metadata import check_user_metadata
from snapshotkit._plan.decide import Decision, decide
from snapshotkit._plan.digest import shared_values_digest, structure_digest
from snapshotkit._plan.gathered import Gathered
from snapshotkit._plan.leaves import LocalState, RankInfo, rank_info
from snapshotkit._plan.rank_plan import FixedPlan, TakePlan, finish_plan, fix_plan
from snapshotkit._plan.select import Selection
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync
from snapshotkit._take import plan_cache
from snapshotkit._take.collect import (
    check_tensor_prepare_func,
    collect_state,
    ddp_replicated_patterns,
    describe_state,
)
from snapshotkit._take.commit import storage_error
from snapshotkit._take.exchange import exchange_descriptions
from snapshotkit._take.replace import manifest_digest, refuse_own_base, stale_objects
from snapshotkit._take.reuse import ReuseIndex, build_reuse_index
from snapshotkit._text import first_few
from snapshotkit.errors import Advice, ConfigError, FolderOfSnapshotsError, SnapshotExistsError, SnapshotkitError
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin
from snapshotkit.storage._registry import split_uri


@dataclasses.dataclass(frozen=True)
class PreparedTake:
    """A take after the first exchange: identical decisions on every rank, this rank's plan.

    Attributes:
        path: rank 0's path, which every rank writes to.
        take_id: names this take's data objects (rank 0's random id).
        local: this rank's described state (its payloads reference the caller's tensors).
        decision: the shared decision.
        plan: this rank's plan.
        user_metadata: this rank's checked ``metadata=`` (rank 0's is the one committed).
        reuse: for an incremental take, the base's pieces it may reference instead of writing.
        plan_reused: whether the plan of the last take on the process group was reused.
        describe_s: seconds spent collecting and describing the state.
        plan_s: seconds spent after that: agreeing, exchanging and planning.
        replace: the take replaces the snapshot at ``path`` (:mod:`~snapshotkit._take.replace`).
        stale: on rank 0 of a replacing take, the data objects at ``path`` before it.
        replaced: on rank 0 of a replacing take, the digest of the manifest it replaces (``""``: none).
    """

    path: str
    take_id: str
    local: LocalState
    decision: Decision
    plan: TakePlan
    user_metadata: Mapping[str, Any]
    reuse: ReuseIndex | None = None
    plan_reused: bool = False
    describe_s: float = 0.0
    plan_s: float = 0.0
    replace: bool = False
    stale: tuple[str, ...] = ()
    replaced: str = ""


#: Loads an incremental take's base: its path, decoded manifest, and the locations of its own
#: bases that are still intact (references to the others are not copied).
LoadBase = Callable[[], tuple[str, SnapshotMetadata, frozenset[str]]]


def prepare_take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    open_plugin: Callable[[str], StoragePlugin] | None,
    user_metadata: object = None,
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
    load_base: LoadBase | None = None,
    partial_shards: bool = False,
    replace: bool = False,
) -> PreparedTake:
    """Collect, describe, exchange and plan (see the module docstring).

    ``user_metadata``, ``include``, ``exclude`` and ``tensor_prepare_func`` (the
    ``_custom_tensor_prepare_func`` hook) are the take's arguments as the caller gave them: they
    are checked here, first; each rank keeps what its own patterns select. A failure on any rank
    (an invalid argument or app_state, a ``state_dict()`` that raises, patterns that select
    nothing, an existing snapshot at the path or ``step_<n>`` snapshots below it, a base that
    cannot be read or lies outside the folder that holds the path) makes every rank raise here,
    before anything is written.
    ``load_base`` (an incremental take) reads the base's manifest on every rank.
    ``partial_shards``: sharded leaves may hold part of their tensor only (a DCP rank's chunks;
    the caller checks the coverage of the union). ``replace`` (a take replacing the snapshot at
    ``path``) skips the refusal of an existing snapshot, lists the data objects there on rank 0,
    and refuses ``path`` itself as the base. Without
    ``open_plugin`` nothing touches storage: a rehearsal that only plans (``prepare_async``).
    """
    started_s = time.perf_counter()
    local: LocalState | None = None
    info: RankInfo | None = None
    error: BaseException | None = None
    stored_metadata: dict[str, Any] = {}
    reuse: ReuseIndex | None = None
    patterns: list[str] = []
    digest = shared_digest = 0
    candidate: plan_cache.CachedPlan | None = None
    stale: tuple[str, ...] = ()
    replaced = ""
    try:
        stored_metadata = check_user_metadata(user_metadata)
        selection = Selection.of(include, exclude)
        prepare = check_tensor_prepare_func(tensor_prepare_func)
        states_of = validate_app_state(app_state)
        if group.rank == 0 and open_plugin is not None:
            replaced, stale = run_sync(
                _refuse_existing_and_close(_open(open_plugin, path), path, group.world_size, replace)
            )
        if load_base is not None:
            base_path, base, intact = load_base()
            if replace:
                refuse_own_base(path, base_path)
            reuse = build_reuse_index(path, base_path, base, config.min_reference_bytes, intact)
            if base.snapshot_id is None and group.rank == 0:
                warnings.warn(
                    f"the base {base_path!r} has format version {base.format_version}, without content hashes: "
                    "this take writes every byte (a snapshot taken by this snapshotkit can be a base)",
                    stacklevel=5,
                )
        states = collect_state(states_of)
        patterns = list(dict.fromkeys([*replicated, *ddp_replicated_patterns(states_of)]))
        with gc_paused():
            local = describe_state(states, selection, prepare)
        described_s = time.perf_counter()
        digest = structure_digest(local, patterns, rank=group.rank, world_size=group.world_size)
        cached = plan_cache.lookup(group)
        if cached is not None and cached.fits(local, digest, config):
            candidate = cached
            shared_digest = shared_values_digest(path, local, cached.replicated_primitives)
    except Exception as exc:
        error = exc
        described_s = time.perf_counter()
    what = "take" if open_plugin is not None else "prepare_async"
    agreement = plan_cache.agree(group, candidate, shared_digest, f"{what}: agreeing whether the last plan holds")
    take_path, take_id = path, agreement.take_id
    fixed: FixedPlan
    if agreement.reused is not None:
        decision, fixed = agreement.reused.decision, agreement.reused.fixed
    else:
        if error is None:
            assert local is not None
            try:
                info = rank_info(local, path, patterns, take_id)
            except Exception as exc:
                error = exc
        exchanged = exchange_descriptions(
            group, info, error, f"{what}: describing each rank's state", "nothing was written"
        )
        gathered = exchanged.gathered
        assert local is not None
        take_path = gathered.path
        with gc_paused():
            decision = decide(gathered, chunk_bytes=config.chunk_bytes, partial_shards=partial_shards)
            fixed = fix_plan(
                local,
                decision,
                rank=group.rank,
                chunk_bytes=config.chunk_bytes,
                data_object_bytes=config.data_object_bytes,
            )
        kept = plan_cache.CachedPlan.of(
            local, digest=digest, token=agreement.token, config=config, decision=decision, fixed=fixed
        )
        plan_cache.remember(group, kept)
        if group.rank == 0:
            _warn_about_paths(gathered)
    assert local is not None
    with gc_paused():
        plan = finish_plan(
            fixed, local, take_id=take_id, chunk_bytes=config.chunk_bytes, data_object_bytes=config.data_object_bytes
        )
    if group.rank == 0:
        _warn_about_differences(decision)
    return PreparedTake(
        take_path,
        take_id,
        local,
        decision,
        plan,
        stored_metadata,
        reuse,
        plan_reused=agreement.reused is not None,
        describe_s=described_s - started_s,
        plan_s=time.perf_counter() - described_s,
        replace=replace,
        stale=stale,
        replaced=replaced,
    )


def _open(open_plugin: Callable[[str], StoragePlugin], path: str) -> StoragePlugin:
    try:
        return open_plugin(path)
    except SnapshotkitError:  # an unknown scheme, a missing optional dependency: already explained
        raise
    except Exception as exc:
        raise storage_error(exc, path, action="opening")  # noqa: B904 - the cause is set


async def refuse_existing(plugin: StoragePlugin, path: str, *, writer: str = "take") -> None:
    """Raise if ``path`` (served by ``plugin``) already holds a snapshot, or ``step_<n>`` snapshots
    below it: nothing is ever overwritten, and no snapshot goes among a manager's steps.

    Raises:
        SnapshotExistsError: there is one; the message says what to do (``writer`` names the caller).
        FolderOfSnapshotsError: ``path`` is a folder of ``step_<n>`` snapshots (see
            :func:`refuse_folder_of_snapshots`).
        StorageError: checking failed (the plugin's error is the cause).
    """
    try:
        exists = await plugin.exists(METADATA_FILENAME)
    except Exception as exc:
        raise storage_error(exc, path, location=METADATA_FILENAME, action="checking for")  # noqa: B904
    if exists:
        problem = f"a snapshot already exists at {path!r}; snapshotkit never overwrites one"
        error = SnapshotExistsError(f"{problem}. Give the {writer} a new path (e.g. one per step: .../step_1000)")
        raise error.advised(Advice(problem, "new_destination", (path,)))

    await refuse_folder_of_snapshots(plugin, path, writer=writer)


async def refuse_folder_of_snapshots(plugin: StoragePlugin, path: str, *, writer: str = "take") -> None:
    """Raise if committed ``step_<n>`` snapshots lie below ``path`` (a SnapshotManager's root, read
    as the manager reads it): a snapshot written there would sit beside them, unseen.

    Costs one listing of ``path`` (on S3 one ``ListObjectsV2`` request for a fresh path; a root's
    refusal pages through its keys). On a file system the directories below ``path`` are looked at
    first, so a directory without ``step_<n>`` subdirectories is never walked. A store that cannot
    list is not checked.

    Raises:
        FolderOfSnapshotsError: there are some; the message names a few and the path meant.
        StorageError: listing failed (the plugin's error is the cause).
    """
    if not plugin.capabilities.listing:
        return
    try:
        if plugin.capabilities.directories and all(step_of(name) is None for name in await plugin.list_dirs("")):
            return
        steps = parse_listing(await plugin.list("")).committed
    except Exception as exc:
        raise storage_error(exc, path, action="listing")  # noqa: B904 - the cause is set
    if steps:
        root = path.rstrip("/")
        problem = (
            f"{root!r} is a folder of {len(steps)} snapshot{'s' if len(steps) > 1 else ''} "
            f"({first_few([step_dir(step) for step in steps], 3, show=str)}), a SnapshotManager's root: a snapshot "
            "written into it would sit beside them, where neither the manager nor `snapshotkit ls` sees it. "
            "Nothing was written"
        )
        error = FolderOfSnapshotsError(
            f"{problem}. Give the {writer} the path of its own step, '{root}/step_<n>' "
            f"(the newest here is '{root}/{step_dir(steps[-1])}')",
            tuple(steps),
        )
        raise error.advised(Advice(problem, "new_destination", (path,)))


async def _refuse_existing_and_close(
    plugin: StoragePlugin, path: str, world_size: int, replace: bool
) -> tuple[str, tuple[str, ...]]:
    """Refuse what a take to ``path`` must not write to; for a replacing take, the digest of the
    manifest it replaces and the stale data objects (:mod:`~snapshotkit._take.replace`)."""
    try:
        if world_size > 1 and plugin.capabilities.process_local:
            raise ConfigError(
                f"{path!r} is a process-local store ({_scheme(path)}): with {world_size} ranks, each rank's data "
                "objects would stay in its own process's memory and the snapshot could not be restored. "
                "Take it to a store every rank reaches (a shared file system path, s3://, gs://)"
            )
        if not replace:
            await refuse_existing(plugin, path)
            return "", ()
        await refuse_folder_of_snapshots(plugin, path)
        try:
            replaced = await manifest_digest(plugin)
        except Exception as exc:
            raise storage_error(exc, path, location=METADATA_FILENAME, action="reading")  # noqa: B904
        try:
            return replaced, await stale_objects(plugin)
        except Exception as exc:
            raise storage_error(exc, path, action="listing")  # noqa: B904 - the cause is set
    finally:
        await plugin.close()


def refuse_process_local(path: str, storage_options: Mapping[str, Any], *, caller: str) -> None:
    """Raise before anything is written if ``path`` is a process-local store (``memory://``):
    the checkpoint daemon of ``executor="process"`` would write into its own memory and the
    committed snapshot would point at nothing. ``caller`` names the argument that asked for it.

    Raises:
        ConfigError: it is; the message says to use ``executor="thread"``.
    """
    plugin = url_to_storage_plugin(path, storage_options)
    try:
        local = plugin.capabilities.process_local
    finally:
        run_sync(plugin.close())
    if local:
        raise ConfigError(
            f"{caller} cannot write to {path!r}: it is a process-local store ({_scheme(path)}) and the "
            "checkpoint daemon is another process, whose writes would land in its own memory, so the "
            'snapshot would point at nothing. Use executor="thread" (or a store every process reaches)'
        )


def _scheme(path: str) -> str:
    return f"{split_uri(path)[0]}://"


def _warn_about_paths(gathered: Gathered) -> None:
    paths = {part.path for part in gathered.replicated_parts}
    if len(paths) > 1:
        warnings.warn(
            f"the ranks passed {len(paths)} different paths to Snapshot.take; rank 0's {gathered.path!r} is used",
            stacklevel=6,  # the user code that called Snapshot.take or Snapshot.async_take
        )


def _warn_about_differences(decision: Decision) -> None:
    if decision.differing:
        shown = first_few(
            sorted(decision.differing.items()), show=lambda item: f"{item[0]!r} (ranks {list(item[1][:4])})"
        )
        warnings.warn(
            f"{len(decision.differing)} path(s) match replicated= patterns but differ between ranks, e.g. {shown}; "
            "they are stored per rank instead",
            stacklevel=6,  # the user code that called Snapshot.take or Snapshot.async_take
        )
