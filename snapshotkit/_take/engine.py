"""The take engine: one pipeline for ``take`` and ``async_take``, whatever the writer.

    prepare (collect, describe, exchange, plan)  ->  stage each data object under the budget
    ->  submit it to the writer  ->  wait for the writes  ->  commit (rank 0 writes the manifest)

``take`` is :func:`start_take` with the :class:`~snapshotkit._take.writers.InlineWriter`, the
waiting and the commit on the caller's thread (collectives for the rendezvous), then
``.wait()``; ``async_take`` is the same with a background writer, returning as soon as staging is
done while a coordinator thread waits for the writes and commits (the process group's store for
the rendezvous: no collective runs off the main thread).

IMPORTANT: whatever fails or is interrupted (staging, a write, another rank, the commit), no
manifest referencing missing data is ever left: every data object this rank wrote is deleted
when it is known that no manifest exists, and kept otherwise (:mod:`~snapshotkit._take.commit`).

Every take reports itself (:mod:`snapshotkit._events`, logger ``snapshotkit.take``), on each rank:
``take_started`` before anything is read; ``take_staged`` once the data is staged (``async_take``:
when it returns; ``take``: once the data objects are written, before the commit); then exactly
one of ``take_committed`` (and an INFO line, with the caller's blocked time for ``async_take``)
and ``take_failed``, from :meth:`~snapshotkit._take.job.TakeJob._finish`, which runs on the
coordinator thread for ``async_take``: so the step is captured at the start. DEBUG lines time each phase: plan, stage
(``take``'s inline writer writes while staging), write, commit. ``progress=True``: a bar of the
bytes written (:mod:`snapshotkit._runtime.progress`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._events import current_step, emit
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.pieces import Piece
from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.rank_plan import TakePlan
from snapshotkit._runtime.gc import gc_paused
from snapshotkit._runtime.interrupt import future_result
from snapshotkit._runtime.progress import ByteProgress
from snapshotkit._runtime.staging import StagingBudget, staging_budget
from snapshotkit._take.commit import CommitPlan, CommitState, discard, keep, logical_paths_in, run_commit, storage_error
from snapshotkit._take.executors import background_writer
from snapshotkit._take.job import TakeJob
from snapshotkit._take.prepare import LoadBase, PreparedTake, prepare_take, refuse_process_local
from snapshotkit._take.rendezvous import CollectiveRendezvous, Rendezvous, StoreRendezvous
from snapshotkit._take.stage import StagedObject
from snapshotkit._take.writers import InlineWriter, Target, WriteJob, Writer
from snapshotkit.storage import open_storage_plugin

logger = logging.getLogger("snapshotkit.take")


@dataclasses.dataclass(frozen=True)
class _Submitted:
    """A data object handed to the writer."""

    plan: DataObjectPlan
    job: WriteJob


@gc_paused()  # the whole take: the caller is blocked anyway (snapshotkit._runtime.gc says why)
def take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    storage_options: Mapping[str, Any],
    user_metadata: object = None,
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
    load_base: LoadBase | None = None,
    progress: bool = False,
    replace: bool = False,
) -> tuple[str, SnapshotMetadata | None]:
    """A synchronous take on every rank of ``group``: the path written (rank 0's) and, on rank 0,
    the committed metadata. ``replace``: replace the snapshot at ``path`` (:mod:`~snapshotkit._take.replace`)."""
    job = start_take(
        path,
        app_state,
        group=group,
        config=config,
        replicated=replicated,
        storage_options=storage_options,
        writer=InlineWriter(),
        user_metadata=user_metadata,
        include=include,
        exclude=exclude,
        tensor_prepare_func=tensor_prepare_func,
        load_base=load_base,
        progress=progress,
        replace=replace,
    )
    return job.path, job.wait()


@gc_paused()  # while the caller is blocked: planning and staging
def async_take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    storage_options: Mapping[str, Any],
    executor: str,
    user_metadata: object = None,
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
    load_base: LoadBase | None = None,
    progress: bool = False,
    replace: bool = False,
) -> TakeJob:
    """Stage and return; a background writer writes and a coordinator thread commits."""
    if executor == "process":  # before the daemon starts or anything is read or written
        refuse_process_local(path, storage_options, caller='async_take(executor="process")')
    writer = background_writer(executor, config.background_niceness)
    return start_take(
        path,
        app_state,
        group=group,
        config=config,
        replicated=replicated,
        storage_options=storage_options,
        writer=writer,
        user_metadata=user_metadata,
        include=include,
        exclude=exclude,
        tensor_prepare_func=tensor_prepare_func,
        load_base=load_base,
        progress=progress,
        replace=replace,
    )


def start_take(
    path: str,
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    storage_options: Mapping[str, Any],
    writer: Writer,
    user_metadata: object = None,
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
    load_base: LoadBase | None = None,
    progress: bool = False,
    replace: bool = False,
) -> TakeJob:
    """Run the pipeline (module docstring) with ``writer``; return once staging is done.

    With the inline writer the writes and the commit also ran when this returns.
    ``user_metadata``, ``include``, ``exclude`` and ``tensor_prepare_func`` are the caller's
    arguments, checked before anything is written; ``load_base`` reads an incremental take's base;
    ``progress`` shows a bar of the bytes written; ``replace`` replaces the snapshot at ``path``.
    """
    started_s, step = time.perf_counter(), current_step()
    emit("take_started", path=path, rank=group.rank, step=step)
    options = dict(storage_options)
    verb = "taking" if isinstance(writer, InlineWriter) else "writing (async_take)"
    bar = ByteProgress(f"{verb} {path}", enabled=progress)
    try:
        prepared = prepare_take(
            path,
            app_state,
            group=group,
            config=config,
            replicated=replicated,
            open_plugin=lambda where: open_storage_plugin(where, options),
            user_metadata=user_metadata,
            include=include,
            exclude=exclude,
            tensor_prepare_func=tensor_prepare_func,
            load_base=load_base,
            replace=replace,
        )
    except BaseException as exc:
        bar.close()
        seconds = time.perf_counter() - started_s
        emit("take_failed", path=path, rank=group.rank, seconds=seconds, error=exc, step=step)
        raise
    logger.debug("take %s: plan %.3f s", path, time.perf_counter() - started_s)
    kwargs: dict[str, Any] = {"started_s": started_s, "step": step, "progress": bar}
    return run_prepared(prepared, group=group, config=config, storage_options=options, writer=writer, **kwargs)


def run_prepared(
    prepared: PreparedTake,
    *,
    group: Group,
    config: Config,
    storage_options: Mapping[str, Any],
    writer: Writer,
    started_s: float | None = None,
    step: int | None = None,
    progress: ByteProgress | None = None,
) -> TakeJob:
    """Stage, write and commit a prepared take (the rest of :func:`start_take`, which passes
    when the take started, its step and its progress bar)."""
    options = dict(storage_options)
    target = Target(prepared.path, options, prepared.reuse)
    job = TakeJob(
        prepared.path,
        rank=group.rank,
        world_size=group.world_size,
        nbytes=prepared.plan.nbytes,
        entries=len(prepared.plan.entries),
        progress=progress,
        step=step,
        started_s=started_s,
    )
    job.progress.set_total(prepared.plan.nbytes)
    try:
        commit = CommitPlan(
            prepared.path,
            options,
            prepared.plan,
            prepared.decision,
            prepared.local.sharded_layouts(),
            group.world_size,
            prepared.user_metadata,
            prepared.reuse.bases if prepared.reuse is not None else {},
            prepared.replace,
            prepared.stale,
            prepared.replaced,
        )
        rendezvous: Rendezvous = CollectiveRendezvous(group)
        if group.distributed and not isinstance(writer, InlineWriter):
            rendezvous = StoreRendezvous(group, f"snapshotkit/{prepared.take_id}/{prepared.path}")
        staging_s = time.perf_counter()
        with gc_paused():
            submitted, staging_error = stage_and_submit(prepared, writer, target, config, job.progress)
        logger.debug("take %s: stage %.3f s", job.path, time.perf_counter() - staging_s)
    except BaseException as exc:  # before anything was handed to _finish: the job still reports how it ended
        job._finish(exc)
        raise
    job.background = not isinstance(writer, InlineWriter)
    del prepared  # the staged copies are all a background writer needs: let the caller's tensors go
    if isinstance(writer, InlineWriter):
        steps = ("take: writing the data objects", "take: committing the manifest")
        _finish(job, commit, writer, target, submitted, staging_error, rendezvous, group.rank, steps)
        return job
    if staging_error is None:
        job._staged()  # before the coordinator starts: its events come after this one
    job.blocked_s = time.perf_counter() - job.started_s
    thread = threading.Thread(
        target=_finish,
        args=(job, commit, writer, target, submitted, staging_error, rendezvous, group.rank, ("async_take",) * 2),
        name=f"snapshotkit-pending-{job.path}",
        daemon=False,  # the interpreter finishes a pending snapshot before it exits
    )
    thread.start()
    if staging_error is not None and not group.distributed:
        job.wait()  # raises the staging error, after the coordinator cleaned up
    return job


def stage_and_submit(
    prepared: PreparedTake, writer: Writer, target: Target, config: Config, progress: ByteProgress
) -> tuple[list[_Submitted], BaseException | None]:
    """Stage every data object under the memory budget and hand it to ``writer``.

    The budget is the process's one staging budget (:mod:`snapshotkit._runtime.staging`), shared
    with every other take in flight: staging waits for bytes their writes give back as it waits
    for its own. A writer that defers writes gets its staged objects when staging would otherwise
    wait for the budget, or at the end. Returns what was submitted and the error that stopped staging.
    """
    payloads = prepared.local.payloads
    budget = staging_budget()
    budget_bytes = config.memory_budget_bytes
    io_slots = writer.io_slots(config.io_concurrency)
    submitted: list[_Submitted] = []
    staged: collections.deque[tuple[StagedObject, int]] = collections.deque()

    def submit_staged() -> None:
        while staged:
            item, cost = staged[0]
            job = writer.submit(target, item, io_slots)
            staged.popleft()  # from here on its write gives its buffer and its bytes back
            job.future.add_done_callback(_releaser(writer, budget, item, cost))
            if progress.enabled:
                job.future.add_done_callback(lambda _, nbytes=item.plan.nbytes: progress.advance(nbytes))
            submitted.append(_Submitted(item.plan, job))

    try:
        for plan in prepared.plan.data_objects:
            cost = writer.staging_cost(plan, payloads)
            if not budget.try_take(cost, budget_bytes, writer.pool):
                submit_staged()  # never wait for room with staged objects nobody will write
                budget.take(cost, budget_bytes, writer.pool)
            try:
                staged.append((writer.stage(plan, payloads), cost))
            except BaseException:
                budget.give(cost)
                raise
            if not writer.defers_writes:
                submit_staged()
        submit_staged()
    except BaseException as exc:  # KeyboardInterrupt included: the commit step cleans up
        for item, cost in staged:  # staged but never sent: nothing to write or delete
            writer.give_back(item)
            budget.give(cost)
        return submitted, exc
    return submitted, None


def _releaser(writer: Writer, budget: StagingBudget, staged: StagedObject, cost: int) -> Any:
    """Once a staged object is written: return its buffer to the writer and its bytes to the budget."""

    def release(_: Any) -> None:
        writer.give_back(staged)
        budget.give(cost)

    return release


def wait_for_writes(
    submitted: Sequence[_Submitted], error: BaseException | None, path: str, plan: TakePlan
) -> tuple[dict[PieceSlot, Piece], BaseException | None]:
    """The final piece of every slot written (or referenced), and the first error. After an error,
    the remaining writes are cancelled (where the writer can) and waited for, so nothing writes once
    this returns."""
    pieces: dict[PieceSlot, Piece] = {}
    cancelled = False
    try:
        for index, item in enumerate(submitted):
            if error is not None and not cancelled:
                cancelled = True
                # Latest first: a queued write is cancelled before the one ahead of it stops and
                # frees its I/O slot, so no new write starts while the take is being cancelled.
                for rest in reversed(submitted[index:]):
                    rest.job.cancel()
            try:
                values = future_result(item.job.future)
            except BaseException as exc:
                if error is None:
                    paths = logical_paths_in(plan, item.plan)
                    error = storage_error(exc, path, location=item.plan.location, logical_paths=paths)
                continue
            pieces.update(zip(item.plan.slots, values, strict=True))
    except BaseException:  # interrupted while waiting: stop every write (latest first) before cleaning up
        for item in reversed(submitted):
            item.job.cancel()
        raise
    return pieces, error


def _finish(
    job: TakeJob,
    commit: CommitPlan,
    writer: Writer,
    target: Target,
    submitted: Sequence[_Submitted],
    error: BaseException | None,
    rendezvous: Rendezvous,
    rank: int,
    steps: tuple[str, str],
) -> None:
    """Wait for this rank's writes, then commit; on a failure delete what this rank wrote if no
    manifest can reference it (:class:`~snapshotkit._take.commit.CommitState`), else keep it."""
    state = CommitState()
    try:
        waiting_s = time.perf_counter()
        try:
            pieces, error = wait_for_writes(submitted, error, commit.path, commit.plan)
        except BaseException as exc:  # interrupted while waiting: the other ranks still hear of it
            pieces, error = {}, exc
        committing_s = time.perf_counter()
        logger.debug("take %s: write %.3f s", job.path, committing_s - waiting_s)
        job.referenced_bytes = sum(piece.nbytes for piece in pieces.values() if piece.base is not None)
        job.nbytes -= job.referenced_bytes  # the bytes written (padding aside)
        if error is None and isinstance(writer, InlineWriter):
            job._staged()  # zero-copy staging: the data is staged once it is written
        metadata = run_commit(commit, rendezvous, rank=rank, pieces=pieces, error=error, steps=steps, state=state)
        logger.debug("take %s: commit %.3f s", job.path, time.perf_counter() - committing_s)
    except BaseException as exc:
        locations = [item.plan.location for item in submitted]
        if state.may_delete:
            discard(commit, locations)
        else:
            keep(commit, locations, exc, state.kept_because)
        job._finish(exc)
    else:
        job._finish(None, metadata)
    finally:
        writer.release(target)
