"""Incremental saves of a manager: which save is full, which snapshot each one takes against, and
which snapshots retention must keep because a kept snapshot reads bytes from them.

No I/O here. A manager with ``incremental=True`` takes each save against the newest committed
snapshot of its root (``Snapshot.take(..., base=...)``) and writes a full snapshot every
``full_every`` saves: the first save is full, the next ``full_every - 1`` are incremental, then
full again. Its record in the snapshot's user metadata says which (``"kind"``) and how many saves
were made since the last full one (``"since_full"``), so a manager opened later continues the count
from the newest snapshot; a snapshot without that record counts as a full one.

IMPORTANT: a snapshot's ``bases`` header lists every snapshot it reads from (references never
chain: a take against B whose pieces live in A references A itself), so keeping the bases of every
kept snapshot keeps everything a kept snapshot needs. :func:`with_bases` still closes over bases of
bases, so a manifest written otherwise cannot make retention break a kept snapshot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from snapshotkit._format.bases import resolve_base
from snapshotkit.errors import ConfigError, InvalidArgumentError

SaveKind = Literal["full", "incremental"]

#: Members of the manager's record (``MANAGER_KEY``) an incremental manager adds.
KIND_MEMBER = "kind"
SINCE_FULL_MEMBER = "since_full"


@dataclasses.dataclass(frozen=True)
class SavePlan:
    """How the next save of an incremental manager is taken.

    Attributes:
        base_step: the step of the snapshot to take against; None for a full save.
        since_full: saves since the last full one, this one included (0 for a full save).
    """

    base_step: int | None
    since_full: int

    @property
    def kind(self) -> SaveKind:
        """``"full"`` or ``"incremental"``."""
        return "full" if self.base_step is None else "incremental"

    def record_members(self) -> dict[str, Any]:
        """The members this plan adds to the manager's record in the snapshot's user metadata."""
        return {KIND_MEMBER: self.kind, SINCE_FULL_MEMBER: self.since_full}


def check_incremental(incremental: object, full_every: object) -> tuple[bool, int]:
    """``incremental`` and ``full_every`` as given to ``SnapshotManager``, checked.

    Raises:
        InvalidArgumentError: a value of the wrong type.
        ConfigError: ``full_every`` below 1.
    """
    if not isinstance(incremental, bool):
        raise InvalidArgumentError(
            f"incremental must be True or False, got {type(incremental).__name__} {incremental!r}"
        )
    if type(full_every) is not int:
        raise InvalidArgumentError(
            f"full_every must be an int (a full snapshot every this many saves), got {type(full_every).__name__} "
            f"{full_every!r}"
        )
    if full_every < 1:
        raise ConfigError(f"full_every must be at least 1 (1: every save is full), got {full_every}")
    return incremental, full_every


def since_full(record: object) -> int:
    """Saves since the last full one that the manager's ``record`` (the raw ``MANAGER_KEY`` value)
    says; 0 (a full snapshot) when the record is missing or says nothing valid."""
    if not isinstance(record, Mapping) or record.get(KIND_MEMBER) != "incremental":
        return 0
    count = record.get(SINCE_FULL_MEMBER)
    return count if type(count) is int and count > 0 else 0


def plan_save(newest: int | None, newest_since_full: int, full_every: int) -> SavePlan:
    """The plan of a save after ``newest`` (the newest committed step, None if there is none),
    which was ``newest_since_full`` saves after a full one."""
    if newest is None or newest_since_full + 1 >= full_every:
        return SavePlan(None, 0)
    return SavePlan(newest, newest_since_full + 1)


def base_steps(root: str, step_path: str, bases: Iterable[str], step_of: Callable[[str], int | None]) -> frozenset[int]:
    """The steps of ``root`` among the base locations ``bases`` of the snapshot at ``step_path``.

    ``step_of`` maps a name below the root to its step (None: not a ``step_<n>`` directory); a
    base elsewhere is no step of this root and is left out (the manager never deletes it).
    """
    found = set()
    inside = root.rstrip("/") + "/"
    for location in bases:
        path = resolve_base(step_path, location)
        if path.startswith(inside):
            step = step_of(path[len(inside) :])
            if step is not None:
                found.add(step)
    return frozenset(found)


def with_bases(kept: Iterable[int], bases_of: Mapping[int, frozenset[int]]) -> frozenset[int]:
    """``kept`` and every step a kept snapshot reads from (directly, or through another base)."""
    result = set(kept)
    todo = list(result)
    while todo:
        for base in bases_of.get(todo.pop(), frozenset()):
            if base not in result:
                result.add(base)
                todo.append(base)
    return frozenset(result)


def deletion_order(doomed: Iterable[int], bases_of: Mapping[int, frozenset[int]]) -> list[int]:
    """``doomed`` ordered so that every snapshot is deleted before the snapshots it reads from
    (a deletion cut short never leaves a snapshot whose base is gone); otherwise by step."""
    left = sorted(set(doomed))
    order: list[int] = []
    while left:
        referenced = {base for step in left for base in bases_of.get(step, frozenset()) if base != step}
        ready = [step for step in left if step not in referenced] or left[:1]  # a cycle: only a crafted manifest
        order.extend(ready)
        left = [step for step in left if step not in ready]
    return order
