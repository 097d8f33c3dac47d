"""The restore side: open the manifest, plan the reads, fetch, place, load.

manifest (:func:`.metadata.load_metadata`)  ->  plan reads for the leaves wanted (:mod:`.plan`, :mod:`.load`)
->  fetch byte ranges under the budget (:mod:`.fetch`)  ->  place into the destinations
->  ``load_state_dict()`` (RNG last)

On several ranks of a gloo group, the pieces every rank wants (replicated state) are read once
and broadcast (:mod:`.share`). A successful :func:`restore` reports itself on each rank: a
``restore_finished`` event (:mod:`snapshotkit._events`) with the bytes this rank read from
storage and received from other ranks, and an INFO line on logger ``snapshotkit.restore`` (path,
entries, bytes, seconds, GiB/s); DEBUG lines time its phases (plan, fetch, load). With
``progress=True`` a bar (:mod:`snapshotkit._runtime.progress`) counts the bytes of the pieces read.
:func:`read_object` reports nothing: it is a lookup, often one of many.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from snapshotkit._app_state import validate_app_state
from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._events import emit, format_bytes, transfer_summary
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    ShardedTensorEntry,
    TensorEntry,
    escape_key,
    is_shared,
    unescape_key,
)
from snapshotkit._format.sharded import destination_boxes
from snapshotkit._plan.flatten import inflate
from snapshotkit._restore.columns import ColumnView, column_rank_view
from snapshotkit._restore.fetch import check_extents, read_pieces
from snapshotkit._restore.fits import describe_mismatch, tensor_matches
from snapshotkit._restore.metadata import OpenPlugin, open_store
from snapshotkit._restore.partial import RestoreReport
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import (
    RestorePlan,
    check_destination,
    close_matches,
    missing_key_hint,
    plan_restore,
    rank_view,
    subtree,
)
from snapshotkit._restore.prefetch import prefetch, prefetch_ranges
from snapshotkit._restore.runs import read_runs
from snapshotkit._restore.share import ShareSession, Transfer, open_session
from snapshotkit._runtime.budget import MemoryBudget
from snapshotkit._runtime.frames import drop_frames
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import run_sync, spawn
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit._runtime.touched import mark_touched
from snapshotkit._text import first_few
from snapshotkit.errors import (
    AppStateKeyNotFoundError,
    InvalidArgumentError,
    LogicalPathNotFoundError,
    StateMismatchError,
)
from snapshotkit.stateful import Stateful
from snapshotkit.storage import StoragePlugin

logger = logging.getLogger("snapshotkit.restore")


def _fetch(
    open_plugin: OpenPlugin, path: str, loader: LeafLoader, config: Config, bar: ByteProgress | None = None
) -> int:
    """Read everything ``loader`` needs; the bytes read from storage."""
    return run_sync(_read_and_close(open_store(open_plugin, path), loader, config, bar))


def fetch_planned(open_plugin: OpenPlugin, path: str, loader: LeafLoader, config: Config) -> int:
    """Read everything ``loader`` planned (ranged reads under the budget, verified) from the
    snapshot at ``path``; the bytes read from storage. The thunks its ``add`` calls returned
    then give the values."""
    return _fetch(open_plugin, path, loader, config)


async def _read_and_close(
    plugin: StoragePlugin, loader: LeafLoader, config: Config, bar: ByteProgress | None = None
) -> int:
    # Not a closure: a failure's traceback holds this frame and the frame its function, so the
    # destinations a closure captured would live as long as the error.
    try:
        # Claimed pieces are proven against the data objects before anything is allocated for them.
        probed_bytes = await check_extents(plugin, loader.claims, io_concurrency=config.io_concurrency)
        loader.allocate()
        loader.begin_fetch()
        if bar is not None:
            bar.set_total(sum(read.piece.nbytes for read in loader.reads) + sum(run.nbytes for run in loader.runs))
        budget = MemoryBudget(config.memory_budget_bytes)
        on_bytes = bar.advance if bar is not None and bar.enabled else None
        # The runs first, then the other reads, not both at once: a data object that cannot be
        # read fails in the same reads every time, naming the same logical paths.
        run_bytes = await read_runs(
            plugin,
            loader.runs,
            budget=budget,
            io_concurrency=config.io_concurrency,
            verify=config.verify_checksums,
            on_bytes=on_bytes,
        )
        return (
            probed_bytes
            + run_bytes
            + await read_pieces(
                plugin,
                loader.reads,
                budget=budget,
                io_concurrency=config.io_concurrency,
                verify=config.verify_checksums,
                on_bytes=on_bytes,
            )
        )
    finally:
        await plugin.close()


@gc_paused()  # the whole restore, load_state_dict() calls included, as a take (_runtime.gc says why)
def restore(
    load: Callable[[], SnapshotMetadata],
    app_state: object,
    *,
    path: str,
    open_plugin: OpenPlugin,
    group: Group,
    config: Config,
    strict: bool,
    weights_only: bool,
    progress: bool = False,
) -> RestoreReport:
    """Load the snapshot into ``app_state`` on every rank of ``group``: every rank restored, or
    every rank raises (nobody trains on from a half-restored state). Returns this rank's report.

    ``app_state`` is checked before ``load()`` reads the manifest, so a wrong argument is
    reported as such whatever is (or is not) at ``path``. The error raised carries the mark of
    :mod:`snapshotkit._runtime.touched`: whether this rank's objects may have been changed (reads
    into in-place destinations started, a ``load_state_dict()`` ran, or this rank loaded and
    another one failed).
    """
    started_s = time.perf_counter()
    error: BaseException | None = None
    report, moved, entries = RestoreReport(), Transfer(), 0
    bar = ByteProgress(f"restoring {path}", enabled=progress)
    try:
        report, moved, entries = _restore_rank(
            load, app_state, path, open_plugin, group, config, strict, weights_only, bar
        )
    except Exception as exc:
        error = exc
    finally:
        bar.close()
    try:
        group.exchange(None, error, "restore: loading the state")
    except Exception as exc:
        if error is None:
            mark_touched(exc, True)  # this rank loaded its state; another rank failed
        raise
    finally:
        error = None  # this frame is in the error's traceback: no reference cycle through it
    seconds = time.perf_counter() - started_s
    where = f"rank {group.rank} of {group.world_size}"
    nbytes, received = moved.read_bytes, moved.received_bytes
    shared = f", {format_bytes(received)} received from other ranks" if received else ""
    moved_text = transfer_summary(nbytes, seconds)
    logger.info("restored snapshot %s: %d entries, %s%s, %s", path, entries, moved_text, shared, where)
    emit("restore_finished", path=path, rank=group.rank, nbytes=nbytes, seconds=seconds, received_bytes=received)
    return report


def _restore_rank(
    load: Callable[[], SnapshotMetadata],
    app_state: object,
    path: str,
    open_plugin: OpenPlugin,
    group: Group,
    config: Config,
    strict: bool,
    weights_only: bool,
    bar: ByteProgress,
) -> tuple[RestoreReport, Transfer, int]:
    """Restore this rank's state: its report, the bytes it read and received, and the entries
    restored (leaves and containers)."""
    session = open_session(group, config)
    # Runs of in-place reads are fetched on their own; the sharing of pieces between ranks reads per piece.
    loader = LeafLoader(weights_only=weights_only, runs=session is None)
    try:
        states_of = validate_app_state(app_state)  # before anything is read: a wrong argument says so
        metadata = load()
        plan, moved, entries = _plan_and_fetch(
            metadata, states_of, path, open_plugin, group.rank, config, strict, loader, session, bar
        )
    except Exception as exc:
        mark_touched(exc, loader.may_have_written)
        del loader  # this frame outlives drop_frames below: let the fresh tensors go with it
        if session is not None:
            session.abandon(exc)  # the other ranks wait for this one to agree on sharing: they raise there
        drop_frames(exc)  # the failed fetch's buffers and fresh tensors go now, not at the next collection
        raise
    loading_s = time.perf_counter()
    try:
        for step in plan.steps:
            step()
    except Exception as exc:
        mark_touched(exc, True)  # some load_state_dict() may have run, or run halfway
        raise
    logger.debug("restore %s: load %.3f s", path, time.perf_counter() - loading_s)
    return plan.report, moved, entries


def _plan_and_fetch(
    metadata: SnapshotMetadata,
    states_of: dict[str, Stateful],
    path: str,
    open_plugin: OpenPlugin,
    rank: int,
    config: Config,
    strict: bool,
    loader: LeafLoader,
    session: ShareSession | None,
    bar: ByteProgress,
) -> tuple[RestorePlan, Transfer, int]:
    view = column_rank_view(metadata, rank) or rank_view(metadata, rank)
    # the entries at or below each key: one pass in C per key (a restore has few keys, many entries)
    roots = {escape_key(key) for key in states_of}
    entries = sum(sum(map(str.startswith, view, itertools.repeat(f"{root}/"))) + (root in view) for root in roots)
    with gc_paused():
        planning_s = time.perf_counter()
        plugin, hinted = open_store(open_plugin, path), None
        try:
            if session is None and isinstance(view, ColumnView):  # the storage reads ahead while this plans
                wanted = None if entries == len(view) else roots  # None: every entry of the view is restored
                hinted = spawn(prefetch(plugin, prefetch_ranges(view, wanted, config.memory_budget_bytes)))
            try:
                plan = plan_restore(
                    view,
                    states_of,
                    strict=strict,
                    loader=loader,
                    snapshot_path=path,
                    hint=lambda key: missing_key_hint(metadata, key, rank),
                )
            finally:
                if hinted is not None:
                    hinted.result()  # the hint is over before the plugin is read from or closed
        except BaseException:
            run_sync(plugin.close())
            raise
        fetching_s = time.perf_counter()
        logger.debug("restore %s: plan %.3f s", path, fetching_s - planning_s)
        if session is None:
            moved = Transfer(run_sync(_read_and_close(plugin, loader, config, bar)))
        else:
            moved = _fetch_shared(plugin, loader, config, session, view, bar)
        logger.debug("restore %s: fetch %.3f s", path, time.perf_counter() - fetching_s)
        return plan, moved, entries


def _fetch_shared(
    plugin: StoragePlugin,
    loader: LeafLoader,
    config: Config,
    session: ShareSession,
    view: Mapping[str, Entry],
    bar: ByteProgress,
) -> Transfer:
    """:func:`_read_and_close`, with the pieces every rank wants read once and shared (collectives
    run on this thread, storage I/O on the loop)."""
    try:
        probed_bytes = run_sync(check_extents(plugin, loader.claims, io_concurrency=config.io_concurrency))
        loader.allocate()
        shared, rest = session.share(plugin, loader.reads, view, on_agreed=loader.begin_fetch)
        loader.begin_fetch()
        bar.set_total(sum(read.piece.nbytes for read in rest))  # the bar counts this rank's own reads
        own_bytes = run_sync(
            read_pieces(
                plugin,
                rest,
                budget=MemoryBudget(config.memory_budget_bytes),
                io_concurrency=config.io_concurrency,
                verify=config.verify_checksums,
                on_bytes=bar.advance if bar.enabled else None,
            )
        )
        return Transfer(probed_bytes + shared.read_bytes + own_bytes, shared.received_bytes)
    finally:
        run_sync(plugin.close())


def read_state_dict(
    metadata: SnapshotMetadata,
    key: str,
    *,
    path: str,
    open_plugin: OpenPlugin,
    rank: int,
    config: Config,
    weights_only: bool,
) -> Any:
    """The state dict saved for the ``app_state`` key ``key`` (not escaped), reading nothing else.

    Raises:
        AppStateKeyNotFoundError: this rank's view of the snapshot has no such key (the message
            lists its keys and close matches), as ``restore`` raises for one; torchsnapshot
            raised an ``AssertionError`` here, which this error also is.
    """
    root = escape_key(key)
    view = rank_view(metadata, rank)
    if root not in view:
        saved_keys = sorted({unescape_key(logical.split("/", 1)[0]) for logical in view})
        raise AppStateKeyNotFoundError(
            f"app_state key {key!r} is not in the snapshot at {path!r} for rank {rank}, which sees "
            f"{first_few(saved_keys, 10)}{close_matches(key, saved_keys)}. "
            "Pass one of the keys the snapshot was taken with"
        )
    return read_object(
        metadata, root, None, path=path, open_plugin=open_plugin, rank=rank, config=config, weights_only=weights_only
    )


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
    try:
        return _read_object(metadata, logical_path, obj_out, path, open_plugin, rank, config, weights_only)
    except Exception as exc:
        drop_frames(exc)  # the failed read's buffers go now, not at the next collection
        raise


def _read_object(
    metadata: SnapshotMetadata,
    logical_path: str,
    obj_out: Any,
    path: str,
    open_plugin: OpenPlugin,
    rank: int,
    config: Config,
    weights_only: bool,
) -> Any:
    if not isinstance(logical_path, str):
        raise InvalidArgumentError(
            f"read_object takes a logical path as a str (e.g. 'model/layer1.weight'), got "
            f"{type(logical_path).__name__} {logical_path!r}. List the paths with Snapshot(path).get_manifest()"
        )
    leaf = _one_leaf(metadata, logical_path, rank)
    if leaf is not None:
        view, logical, entry = {logical_path: leaf}, logical_path, leaf
    else:
        view, logical = _resolve_logical_path(metadata, logical_path, rank, path)
        entry = view[logical]
    if obj_out is not None and not _is_tensor(obj_out):
        # torchsnapshot's rule, kept for code written against it: such an obj_out is ignored.
        logger.warning(
            "read_object(%r): obj_out is a %s, not a tensor to load into; it is ignored and the stored value "
            "returned (pass obj_out=None)",
            logical_path,
            type(obj_out).__name__,
        )
        obj_out = None
    if obj_out is not None:
        _check_obj_out(logical, entry, obj_out)
    loader = LeafLoader(weights_only=weights_only)
    containers, leaves = subtree(view, logical)
    with gc_paused():
        if containers:
            thunks = {p: loader.add(p, e) for p, e in leaves.items()}
        else:
            thunks = {logical: loader.add(logical, entry, obj_out)}
        _fetch(open_plugin, path, loader, config)
    return inflate(logical, containers, {p: thunk() for p, thunk in thunks.items()})


def _is_tensor(value: object) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _check_obj_out(logical_path: str, entry: Entry, obj_out: Any) -> None:
    """Refuse a tensor ``obj_out`` that read_object could not load into, before anything is read."""
    if not isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        raise StateMismatchError(
            f"cannot load {logical_path!r} into obj_out: the snapshot holds a {entry.kind} there, not a tensor. "
            "Pass obj_out=None to get the stored value returned"
        )
    check_destination(logical_path, entry, obj_out, module=False)
    if isinstance(entry, TensorEntry):
        if not tensor_matches(entry, obj_out):
            raise describe_mismatch(logical_path, entry, obj_out)
        return
    dtype = str(obj_out.dtype).removeprefix("torch.")
    # A DTensor/ShardedTensor obj_out is checked when its reads are planned.
    if destination_boxes(obj_out) is None and (dtype != entry.dtype or tuple(obj_out.shape) != entry.shape):
        raise StateMismatchError(
            f"cannot load {logical_path!r} into obj_out: the snapshot has dtype {entry.dtype} shape "
            f"{list(entry.shape)}, obj_out has dtype {dtype} shape {list(obj_out.shape)}. "
            "Pass a tensor of the saved dtype and shape, or obj_out=None to get a new tensor"
        )


def _one_leaf(metadata: SnapshotMetadata, logical_path: str, rank: int) -> Entry | None:
    """The leaf ``rank``'s view holds at ``logical_path``, found by key without building the view
    (a version-5 manifest builds that one entry), or None for anything else (a container, a path
    the view lacks or that names another rank's): :func:`rank_view` decides those."""
    manifest = metadata.manifest
    entry = manifest.get(f"{rank}/{logical_path}") if rank < metadata.world_size else None
    if entry is None and rank != 0:
        entry = manifest.get(f"0/{logical_path}")
        entry = entry if entry is not None and is_shared(entry) else None
    return None if entry is None or isinstance(entry, (DictEntry, ListEntry)) else entry


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
