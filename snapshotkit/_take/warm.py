"""Warming a background writer before the first ``async_take`` (``Snapshot.prepare_async``).

The first ``async_take`` of a process allocates its staging buffers, and the kernel faults their
pages in while staging copies into them: a first call costs seconds where later ones cost about
a memcpy. :func:`prepare_writer` plans the take the way ``async_take`` would (same describe,
exchange and planning functions, same config), then has the writer allocate and fault in the
buffers that take holds at once, bounded by the memory budget (charged to the process's staging
budget, :mod:`snapshotkit._runtime.staging`: free buffers of other sizes make room, buffers in
use by a pending take are not touched). Nothing is written to storage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from snapshotkit._config import Config
from snapshotkit._dist import Group
from snapshotkit._plan.leaves import LocalState
from snapshotkit._plan.rank_plan import TakePlan
from snapshotkit._runtime.staging import staging_budget
from snapshotkit._take.executors import EXECUTORS, background_writer
from snapshotkit._take.prepare import prepare_take
from snapshotkit._take.writers import Writer, bucket_bytes
from snapshotkit.errors import ConfigError

#: Stands in for the snapshot path while planning: sizes and layouts do not depend on it.
_NO_PATH = "prepare_async://"


@runtime_checkable
class Preallocating(Protocol):
    """A writer whose staging buffers can be made ahead of a take."""

    def preallocate(self, sizes: Counter[int], *, pinned: bool = False) -> int:
        """Have at least ``sizes[size]`` free buffers of each bucket ``size``, pages faulted in
        (and those made now pinned, with ``pinned``: the state has GPU tensors); return the bytes
        of buffers made now."""
        ...


def plan_like_async_take(
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
) -> tuple[TakePlan, LocalState]:
    """This rank's plan of an ``async_take`` of ``app_state`` (collective, like the take: every
    rank calls it): the take's own first phase, without storage. Invalid arguments raise on every
    rank, before anything is allocated."""
    prepared = prepare_take(
        _NO_PATH,
        app_state,
        group=group,
        config=config,
        replicated=replicated,
        open_plugin=None,
        include=include,
        exclude=exclude,
        tensor_prepare_func=tensor_prepare_func,
    )
    return prepared.plan, prepared.local


def buffers_held_at_once(plan: TakePlan, local: LocalState, writer: Writer, budget_bytes: int) -> Counter[int]:
    """Bucket size -> count of the staging buffers a take of ``plan`` holds before it first waits
    for the budget (what the engine's staging loop reserves: the first object always, then each
    next one while it fits; the pool then keeps those that fit in the budget)."""
    sizes: Counter[int] = Counter()
    reserved_bytes = 0
    for data_object in plan.data_objects:
        cost = writer.staging_cost(data_object, local.payloads)
        if sizes and reserved_bytes + cost > budget_bytes:
            break
        reserved_bytes += cost
        sizes[bucket_bytes(data_object.nbytes)] += 1
    return sizes


def prepare_async(
    app_state: object,
    *,
    group: Group,
    config: Config,
    replicated: Sequence[str],
    executor: str,
    include: object = None,
    exclude: object = None,
    tensor_prepare_func: object = None,
) -> int:
    """Plan an ``async_take`` of ``app_state`` with ``executor`` and warm its writer (the one
    ``async_take`` uses: same executor, same niceness); the bytes of buffers made now."""
    if executor not in EXECUTORS:  # checked before the state is described or anything allocated
        raise ConfigError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    plan, local = plan_like_async_take(
        app_state,
        group=group,
        config=config,
        replicated=replicated,
        include=include,
        exclude=exclude,
        tensor_prepare_func=tensor_prepare_func,
    )
    return prepare_writer(background_writer(executor, config.background_niceness), plan, local, config)


def prepare_writer(writer: Writer, plan: TakePlan, local: LocalState, config: Config) -> int:
    """Allocate and fault in ``writer``'s buffers for ``plan``; return the bytes of buffers made now
    (0 when an earlier take or warm-up already made them)."""
    if not isinstance(writer, Preallocating):  # pragma: no cover - both background writers are
        return 0
    staging_budget().resize(config.memory_budget_bytes)  # the pools keep no more than this
    sizes = buffers_held_at_once(plan, local, writer, config.memory_budget_bytes)
    pinned = any(payload.tensor is not None and payload.tensor.is_cuda for payload in local.payloads)
    return writer.preallocate(sizes, pinned=pinned)
