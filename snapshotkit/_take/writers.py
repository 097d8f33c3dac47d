"""``async_take``: stage the state, return, write and commit in the background.

The caller's thread does what must happen before it may touch its state again: collect and
describe the state and plan (the same :func:`~snapshotkit._take.engine.prepare_take` as ``take``,
including the first exchange between ranks), serialize objects, and copy every tensor piece
into *staging buffers*, one per data object, laid out exactly as the object is stored. It
returns once the last piece is staged. Staging runs under the memory budget: when staged but
not yet written bytes would exceed it, staging waits for background writes to drain.

Staged data objects go to a *writer*:

* ``executor="thread"``: snapshotkit's I/O event loop (a background thread and its pool)
  checksums and writes them;
* ``executor="process"``: a long-lived checkpoint daemon process, started on first use and
  reused, receives each staged object through a shared-memory segment (the segments are pooled
  and reused between snapshots; only small control messages cross its pipe), checksums it and
  writes it with the same storage plugins, so checksumming and storage calls never hold the
  trainer's GIL.

A coordinator thread per pending snapshot waits for the writes, then commits: alone, or with
several ranks through the process group's store (no collective runs off the main thread):
every rank publishes its result or error, rank 0 merges, commits and publishes the outcome.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import datetime
import multiprocessing.connection
import os
import pickle
import socket
import subprocess
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

import torch

from snapshotkit._config import Config
from snapshotkit._dist import Group, RankOutcome, portable
from snapshotkit._format.checksum import crc32c
from snapshotkit._format.serialization import byte_view, flat_range_views, tensor_from_bytes
from snapshotkit._plan.layout import DataObjectPlan
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.loop import background_loop, run_sync
from snapshotkit._take.engine import (
    PreparedTake,
    RankResult,
    _discard,
    build_metadata,
    commit,
    finish_rank,
    merge_results,
    prepare_take,
    sharded_layouts,
)
from snapshotkit._take.stage import Payload
from snapshotkit.errors import (
    CheckpointDaemonError,
    CollectiveTimeoutError,
    ConfigError,
    RankFailedError,
    SnapshotkitError,
    StorageError,
    WaitTimeoutError,
)
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin

if TYPE_CHECKING:
    from snapshotkit.snapshot import Snapshot

EXECUTORS = ("thread", "process")


# ============================================================================ staging


class _StagingBudget:
    """Host bytes staged but not yet written; ``acquire`` blocks the caller until they fit."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._cond = threading.Condition()

    def fits(self, nbytes: int) -> bool:
        """Whether ``acquire(nbytes)`` would return without waiting."""
        with self._cond:
            return self.used == 0 or self.used + nbytes <= self.total

    def acquire(self, nbytes: int) -> None:
        with self._cond:
            # An object larger than the budget runs alone rather than never.
            self._cond.wait_for(lambda: self.used == 0 or self.used + nbytes <= self.total)
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.used -= nbytes
            self._cond.notify_all()


def stage_object(plan: DataObjectPlan, payloads: Sequence[Payload], out: memoryview, stream: Any = None) -> None:
    """Copy the pieces of ``plan`` into ``out`` at their offsets (the data object's exact bytes).

    GPU pieces are copied on ``stream`` (a side CUDA stream) without blocking and waited for at
    the end, so the copies overlap each other; ``out`` should then be pinned host memory.
    """
    position = 0
    pending_gpu = False
    for slot in plan.slots:
        if slot.offset > position:
            out[position : slot.offset] = bytes(slot.offset - position)  # alignment padding
        destination = out[slot.offset : slot.offset + slot.nbytes]
        payload = payloads[slot.payload]
        if payload.data is not None:
            destination[:] = memoryview(payload.data)[slot.start : slot.end]
        else:
            tensor = payload.tensor
            assert tensor is not None
            source = tensor.detach()
            if source.is_conj() or source.is_neg():
                source = source.resolve_conj().resolve_neg()
            first, last = slot.start // payload.itemsize, slot.end // payload.itemsize
            target = tensor_from_bytes(destination, source.dtype, (last - first,))
            gpu = source.is_cuda and stream is not None
            pending_gpu = pending_gpu or gpu
            with torch.cuda.stream(stream) if gpu else contextlib.nullcontext():
                position_in_target = 0
                for view in flat_range_views(source, first, last):
                    count = view.numel()
                    target[position_in_target : position_in_target + count].view(view.shape).copy_(
                        view, non_blocking=gpu
                    )
                    position_in_target += count
        position = slot.offset + slot.nbytes
    if pending_gpu:
        stream.synchronize()


def staged_checksums(view: memoryview, slots: Sequence[tuple[int, int, int, int]]) -> dict[tuple[int, int], int]:
    """CRC-32C of each ``(payload, start, offset, nbytes)`` slot of a staged object."""
    return {(payload, start): crc32c(view[offset : offset + nbytes]) for payload, start, offset, nbytes in slots}


def _slots(plan: DataObjectPlan) -> list[tuple[int, int, int, int]]:
    return [(s.payload, s.start, s.offset, s.nbytes) for s in plan.slots]


# ============================================================================ writers


@dataclasses.dataclass
class _Target:
    """Where a pending snapshot writes: its URI and storage options (sent to the daemon)."""

    path: str
    storage_options: dict[str, Any]


def plugin_key(path: str, storage_options: Mapping[str, Any]) -> tuple[str, str]:
    """Writers keep one plugin instance per (path, options) while snapshots to it are pending."""
    return path, repr(sorted(storage_options.items()))


class _ThreadWriter:
    """Writes staged objects on a background event loop whose threads run at low priority."""

    name = "thread"

    def __init__(self, niceness: int) -> None:
        self._buffers: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.loop = background_loop(niceness)
        self._plugins: dict[tuple[str, str], StoragePlugin] = {}

    def buffer(self, nbytes: int) -> tuple[memoryview, Any]:
        size = _bucket(nbytes)
        with self._lock:
            pool = self._buffers.get(size)
            raw = pool.pop() if pool else None
        if raw is None:
            # Pinned host memory when CUDA is present, so GPU pieces copy asynchronously.
            raw = torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return byte_view(raw)[:nbytes], raw

    def give_back(self, handle: Any) -> None:
        with self._lock:
            self._buffers.setdefault(handle.numel(), []).append(handle)

    def submit(
        self,
        target: _Target,
        location: str,
        view: memoryview,
        handle: Any,
        slots: list[tuple[int, int, int, int]],
        io_slots: Any,
    ) -> concurrent.futures.Future[dict[tuple[int, int], int]]:
        plugin = self._plugin_for(target)

        async def write() -> dict[tuple[int, int], int]:
            async with io_slots:
                loop = asyncio.get_running_loop()
                checksums = await loop.run_in_executor(None, staged_checksums, view, slots)
                await plugin.write(location, [view])
            return checksums

        return asyncio.run_coroutine_threadsafe(write(), self.loop)

    def io_slots(self, count: int) -> Any:
        async def make() -> asyncio.Semaphore:
            return asyncio.Semaphore(count)

        return asyncio.run_coroutine_threadsafe(make(), self.loop).result()

    def _plugin_for(self, target: _Target) -> StoragePlugin:
        """One plugin instance per (path, options), used only on this writer's loop."""
        key = plugin_key(target.path, target.storage_options)
        with self._lock:
            plugin = self._plugins.get(key)
            if plugin is None:
                plugin = self._plugins[key] = url_to_storage_plugin(target.path, target.storage_options)
            return plugin

    def release(self, target: _Target) -> None:
        """Close the plugin of a finished snapshot (on the loop it was used on)."""
        key = plugin_key(target.path, target.storage_options)
        with self._lock:
            plugin = self._plugins.pop(key, None)
        if plugin is not None:
            asyncio.run_coroutine_threadsafe(plugin.close(), self.loop).result()


def _bucket(nbytes: int) -> int:
    """Buffer sizes come in powers of two (at least 1 MiB) so pooled buffers get reused."""
    return max(1 << 20, 1 << max(0, nbytes - 1).bit_length())


# ---------------------------------------------------------------------------- the daemon


# Lowers the daemon's priority before anything is imported: threads that imports start (torch's)
# inherit the niceness of the thread that creates them.
_DAEMON_BOOTSTRAP = """\
import os, sys
if int(sys.argv[2]) > 0:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(int(sys.argv[2]), os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
from snapshotkit._take.daemon import main
main()
"""


class _ProcessWriter:
    """Sends staged objects to the checkpoint daemon through pooled shared-memory segments."""

    name = "process"

    def __init__(self, niceness: int) -> None:
        from snapshotkit.storage._registry import _registered

        registrations = {}
        for scheme, factory in _registered.items():
            try:
                pickle.dumps(factory)
            except Exception:  # noqa: S112 - lambdas and closures cannot reach the daemon
                continue
            registrations[scheme] = factory
        # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's
        # __main__ and fails in scripts without a main guard), connected by a socket pair.
        parent, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DAEMON_BOOTSTRAP, str(child.fileno()), str(niceness)],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self._connection = multiprocessing.connection.Connection(parent.detach())
        self._connection.send(registrations)
        self._futures: dict[int, concurrent.futures.Future[dict[tuple[int, int], int]]] = {}
        self._next_job = 0
        self._lock = threading.Lock()
        self._segments: dict[int, list[shared_memory.SharedMemory]] = {}
        self._all_segments: list[shared_memory.SharedMemory] = []
        self.dead: str | None = None
        self._reader = threading.Thread(target=self._read_replies, name="snapshotkit-daemon-replies", daemon=True)
        self._reader.start()

    def _read_replies(self) -> None:
        while True:
            try:
                message = self._connection.recv()
            except (EOFError, OSError):
                self._fail_all(f"the checkpoint daemon (pid {self.process.pid}) exited")
                return
            with self._lock:
                future = self._futures.pop(message[1], None)
            if future is None:
                continue
            if message[0] == "done":
                future.set_result(message[2])
            else:
                error = message[2] if message[2] is not None else StorageError(message[3])
                future.set_exception(error)

    def _fail_all(self, reason: str) -> None:
        try:
            code: int | None = self.process.wait(1)
        except subprocess.TimeoutExpired:
            code = None
        self.dead = f"{reason} (exit code {code})"
        with self._lock:
            futures, self._futures = self._futures, {}
        for future in futures.values():
            future.set_exception(
                CheckpointDaemonError(
                    f"{self.dead} before writing every data object; the snapshot was not committed. "
                    "The next async_take starts a new daemon"
                )
            )

    @property
    def alive(self) -> bool:
        return self.dead is None and self.process.poll() is None

    def buffer(self, nbytes: int) -> tuple[memoryview, Any]:
        size = _bucket(nbytes)
        with self._lock:
            pool = self._segments.get(size)
            segment = pool.pop() if pool else None
        if segment is None:
            segment = shared_memory.SharedMemory(create=True, size=size)
            with self._lock:
                self._all_segments.append(segment)
        assert segment.buf is not None
        return segment.buf[:nbytes], segment

    def give_back(self, handle: Any) -> None:
        with self._lock:
            self._segments.setdefault(handle.size, []).append(handle)

    def io_slots(self, count: int) -> Any:
        return count  # the daemon holds one semaphore per count

    def submit(
        self,
        target: _Target,
        location: str,
        view: memoryview,
        handle: Any,
        slots: list[tuple[int, int, int, int]],
        io_slots: Any,
    ) -> concurrent.futures.Future[dict[tuple[int, int], int]]:
        future: concurrent.futures.Future[dict[tuple[int, int], int]] = concurrent.futures.Future()
        with self._lock:
            job = self._next_job
            self._next_job += 1
            self._futures[job] = future
        message = (
            "write",
            job,
            target.path,
            target.storage_options,
            location,
            handle.name,
            view.nbytes,
            slots,
            io_slots,
        )
        try:
            if self.dead is not None:
                raise CheckpointDaemonError(self.dead)
            self._connection.send(message)
        except (OSError, ValueError, CheckpointDaemonError) as exc:
            with self._lock:
                self._futures.pop(job, None)
            future.set_exception(
                CheckpointDaemonError(f"could not reach the checkpoint daemon ({exc}); the snapshot was not committed")
            )
        return future

    def shutdown(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._connection.send(("stop",))
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        for segment in self._all_segments:
            try:
                segment.close()
                segment.unlink()
            except (FileNotFoundError, BufferError):
                pass


_writers: dict[tuple[str, int], Any] = {}
_writers_lock = threading.Lock()


def _writer(executor: str, niceness: int) -> Any:
    """The writer for ``executor`` at ``niceness``: created on first use, then reused."""
    key = (executor, niceness)
    with _writers_lock:
        writer = _writers.get(key)
        if executor == "process" and (writer is None or not writer.alive):
            if writer is not None:
                writer.shutdown()
            writer = _writers[key] = _ProcessWriter(niceness)
        elif writer is None:
            writer = _writers[key] = _ThreadWriter(niceness)
        return writer


def checkpoint_daemon_pid() -> int | None:
    """The pid of a running checkpoint daemon, if there is one (for tests and monitoring)."""
    for (executor, _), writer in list(_writers.items()):
        if executor == "process" and writer.alive:
            return int(writer.process.pid)
    return None


# ============================================================================ pending snapshots


_pending: weakref.WeakSet[PendingSnapshot] = weakref.WeakSet()


class PendingSnapshot:
    """A snapshot being written in the background; :meth:`wait` gives the committed :class:`Snapshot`.

    Attributes:
        path: where the snapshot is being written (rank 0's path).
    """

    def __init__(self, path: str, snapshot_factory: Callable[[], Snapshot]) -> None:
        self.path = path
        self._snapshot_factory = snapshot_factory
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._snapshot: Snapshot | None = None
        self._thread: threading.Thread | None = None
        _pending.add(self)

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"PendingSnapshot({self.path!r}, {state})"

    def done(self) -> bool:
        """Whether the background work finished (committed, or failed)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Snapshot:
        """Block until the snapshot is committed and return it; raise what went wrong.

        Raises:
            WaitTimeoutError: ``timeout`` seconds passed first; the snapshot keeps being
                written and ``wait`` may be called again.
            RankFailedError: another rank's writes failed (its error is the cause).
            CheckpointDaemonError: the checkpoint daemon died.
            StorageError, ...: this rank's own failure, as ``take`` would raise it.
        """
        if not self._done.wait(timeout):
            raise WaitTimeoutError(
                f"the snapshot at {self.path!r} is still being written after {timeout} s; nothing was lost: "
                "call wait() again, or check done()"
            )
        if self._error is not None:
            raise self._error
        assert self._snapshot is not None
        return self._snapshot

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        if error is None:
            self._snapshot = self._snapshot_factory()
        self._done.set()


def _wait_for_pending_at_exit() -> None:
    """At interpreter exit, finish what is pending (or let it fail): never leave a half take."""
    for pending in list(_pending):
        pending._done.wait()
    with _writers_lock:
        daemons = [_writers.pop(key) for key in list(_writers) if key[0] == "process"]
    for writer in daemons:
        writer.shutdown()


def _wait_for_pending_before_pools_stop() -> None:
    for pending in list(_pending):
        pending._done.wait()


# Interpreter exit first runs threading's exit hooks, newest first: concurrent.futures' hook
# stops every thread pool (including the I/O loop's), so pending snapshots must finish before
# it. Registered after concurrent.futures was imported, this hook runs before that one.
_register_threading_atexit = getattr(threading, "_register_atexit", None)
if _register_threading_atexit is not None:
    _register_threading_atexit(_wait_for_pending_before_pools_stop)
atexit.register(_wait_for_pending_at_exit)


def async_take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    storage_options: Mapping[str, Any],
    executor: str,
    snapshot_factory: Callable[[str], Snapshot],
) -> PendingSnapshot:
    """Stage ``app_state`` and return; write and commit in the background (see the module doc)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    options = dict(storage_options)
    prepared = prepare_take(
        path,
        app_state,
        group=group,
        config=config,
        replicated=replicated,
        open_plugin=lambda where: url_to_storage_plugin(where, options),
    )
    writer = _writer(executor, config.background_niceness)
    target = _Target(prepared.path, options)
    budget = _StagingBudget(config.memory_budget_bytes)
    io_slots = writer.io_slots(config.io_concurrency)
    pending = PendingSnapshot(prepared.path, lambda: snapshot_factory(prepared.path))
    futures: list[tuple[str, concurrent.futures.Future[dict[tuple[int, int], int]]]] = []
    plan = prepared.plan
    stream = torch.cuda.Stream() if torch.cuda.is_available() and executor == "thread" else None  # type: ignore[no-untyped-call]
    # Staged objects are handed to the writer only when staging would otherwise wait for the
    # budget, or at the end: writes then do not compete with staging for CPU and memory bandwidth.
    staged: list[tuple[DataObjectPlan, memoryview, Any]] = []

    def submit_staged() -> None:
        for obj, view, handle in staged:
            future = writer.submit(target, obj.location, view, handle, _slots(obj), io_slots)
            future.add_done_callback(_releaser(budget, writer, obj.nbytes, handle))
            futures.append((obj.location, future))
        staged.clear()

    try:
        with gc_paused():
            try:
                for obj in plan.data_objects:
                    if not budget.fits(obj.nbytes):
                        submit_staged()
                    budget.acquire(obj.nbytes)
                    view, handle = writer.buffer(obj.nbytes)
                    try:
                        stage_object(obj, plan.payloads, view, stream)
                    except BaseException:
                        budget.release(obj.nbytes)
                        writer.give_back(handle)
                        raise
                    staged.append((obj, view, handle))
            except BaseException:
                for obj, _, handle in staged:  # staged but never sent: nothing to write or delete
                    budget.release(obj.nbytes)
                    writer.give_back(handle)
                staged.clear()
                raise
            submit_staged()
    except BaseException as exc:
        # Staging failed on this rank: the others must learn it at the commit step.
        staging_error: BaseException | None = exc
    else:
        staging_error = None
    plan.payloads = []  # the staged copies are all the writer needs; let the caller's tensors go
    thread = threading.Thread(
        target=_coordinate,
        args=(pending, prepared, group, config, target, writer, futures, staging_error),
        name=f"snapshotkit-pending-{prepared.take_id}",
        daemon=False,  # the interpreter finishes a pending snapshot before it exits
    )
    pending._thread = thread
    thread.start()
    if staging_error is not None and not group.distributed:
        pending.wait()  # raises the staging error, after the coordinator cleaned up
    return pending


def _releaser(budget: _StagingBudget, writer: Any, nbytes: int, handle: Any) -> Callable[[Any], None]:
    """Once a staged object is written: free its budget and return its buffer to the pool."""

    def release(_: Any) -> None:
        writer.give_back(handle)
        budget.release(nbytes)

    return release


def _coordinate(
    pending: PendingSnapshot,
    prepared: PreparedTake,
    group: Group,
    config: Config,
    target: _Target,
    writer: Any,
    futures: list[tuple[str, concurrent.futures.Future[dict[tuple[int, int], int]]]],
    staging_error: BaseException | None,
) -> None:
    """Wait for this rank's writes, exchange outcomes through the store, commit (rank 0)."""
    written = [location for location, _ in futures]
    error: BaseException | None = staging_error
    result: RankResult | None = None
    checksums: dict[tuple[int, int], int] = {}
    for _, future in futures:
        try:
            checksums.update(future.result())
        except BaseException as exc:
            if error is None:
                error = _as_storage_error(exc, target.path)
    if error is None:
        result = finish_rank(prepared.plan, checksums)
    try:
        if group.distributed:
            _commit_through_store(prepared, group, config, target, result, error)
        elif error is not None:
            raise error
        else:
            _commit_alone(prepared, group, target, result)
    except BaseException as exc:
        run_sync(_discard_all(target, written))
        pending._finish(exc)
    else:
        pending._finish(None)
    finally:
        if isinstance(writer, _ThreadWriter):
            writer.release(target)


def _as_storage_error(exc: BaseException, path: str) -> BaseException:
    if isinstance(exc, OSError) and not isinstance(exc, SnapshotkitError):
        error = StorageError(
            f"writing the snapshot at {path!r} failed: {type(exc).__name__}: {exc}. Nothing was committed; "
            "check the path, permissions and free space, then take again"
        )
        error.__cause__ = exc
        return error
    return exc


def _commit_alone(prepared: PreparedTake, group: Group, target: _Target, result: RankResult | None) -> None:
    assert result is not None
    metadata = build_metadata(merge_results([result], prepared.decision, sharded_layouts(prepared.local)), 1)

    async def run() -> None:
        plugin = url_to_storage_plugin(target.path, target.storage_options)
        try:
            await commit(plugin, metadata, path=target.path)
        finally:
            await plugin.close()

    run_sync(run())


async def _discard_all(target: _Target, written: Sequence[str]) -> None:
    plugin = url_to_storage_plugin(target.path, target.storage_options)
    try:
        await _discard(plugin, written)
    finally:
        await plugin.close()


def _store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def _commit_through_store(
    prepared: PreparedTake,
    group: Group,
    config: Config,
    target: _Target,
    result: RankResult | None,
    error: BaseException | None,
) -> None:
    """The multi-rank commit, off the main thread: a barrier through the process group's store."""
    store = _store()
    prefix = f"snapshotkit/{prepared.take_id}/{prepared.path}/"
    timeout = datetime.timedelta(seconds=config.collective_timeout_seconds)
    mine = RankOutcome(result) if error is None else RankOutcome(None, portable(error), _describe(error))
    store.set(f"{prefix}result/{group.rank}", pickle.dumps(mine))

    def wait_for(keys: list[str], what: str) -> None:
        try:
            store.wait(keys, timeout)
        except RuntimeError as exc:
            raise CollectiveTimeoutError(
                f"{what}: rank {group.rank} of {group.world_size} waited {config.collective_timeout_seconds:g} s for "
                "the other ranks' background writes, which did not finish; nothing was committed"
            ) from exc

    if group.rank == 0:
        keys = [f"{prefix}result/{r}" for r in range(group.world_size)]
        wait_for(keys, "async_take: waiting for every rank's writes")
        outcomes: list[RankOutcome] = [pickle.loads(store.get(k)) for k in keys]  # noqa: S301 - our ranks
        failed = [(r, o) for r, o in enumerate(outcomes) if o.error_text]
        commit_error: BaseException | None = None
        if not failed:
            try:
                results = [o.value for o in outcomes]
                manifest = merge_results(results, prepared.decision, sharded_layouts(prepared.local))
                metadata = build_metadata(manifest, group.world_size)

                async def run() -> None:
                    plugin = url_to_storage_plugin(target.path, target.storage_options)
                    try:
                        await commit(plugin, metadata, path=target.path)
                    finally:
                        await plugin.close()

                run_sync(run())
            except BaseException as exc:
                commit_error = exc
        verdict = (
            RankOutcome(None, None, "")
            if not failed and commit_error is None
            else RankOutcome(
                None,
                portable(commit_error) if commit_error is not None else failed[0][1].error,
                _describe(commit_error) if commit_error is not None else failed[0][1].error_text,
            )
        )
        failing_rank = 0 if commit_error is not None else (failed[0][0] if failed else -1)
        store.set(f"{prefix}commit", pickle.dumps((failing_rank, verdict)))
    else:
        wait_for([f"{prefix}commit"], "async_take: waiting for rank 0's commit")
        failing_rank, verdict = pickle.loads(store.get(f"{prefix}commit"))  # noqa: S301 - our ranks
    if error is not None:
        raise error
    if verdict.error_text:
        if failing_rank == group.rank and verdict.error is not None:
            raise verdict.error
        raise RankFailedError(
            f"async_take: rank {failing_rank} failed with {verdict.error_text}; nothing was committed", failing_rank
        ) from verdict.error


def _describe(error: BaseException | None) -> str:
    if error is None:
        return ""
    return "".join(traceback.format_exception_only(type(error), error)).strip()


__all__ = ["EXECUTORS", "PendingSnapshot", "async_take", "checkpoint_daemon_pid"]
