"""Fault injection at every step of a take's commit protocol, and the invariant checked after it.

A :class:`Fault` names a step of the protocol (a storage call or a rendezvous), what happens
there (a failure, a failure after the call took effect, Ctrl-C before or after it, a delay past
the collective timeout) and the rank it happens on. :func:`run_cases` takes one snapshot per
case, on every rank of the calling process group, with that case's faults installed, and
reports how each rank's call ended; :func:`check_invariant` then checks, for every case, the one
thing the protocol promises: either no manifest exists, or the snapshot verifies and restores
bit-exact on every rank; and a take that returned normally on any rank committed.

The storage faults ride on a picklable plugin factory (they reach the checkpoint daemon of
``executor="process"``); the rendezvous faults wrap the rendezvous classes in the rank's process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.entries import METADATA_FILENAME
from snapshotkit._take import rendezvous
from snapshotkit.storage import FSStoragePlugin, StoragePlugin, register_storage_plugin
from snapshotkit.verify import verify_snapshot

SCHEME = "commitfaults"
#: Storage points: data-object writes, the manifest write (``replace`` for a replacing take), its
#: read-back (a read of the manifest once that write started: a replacing take also reads it
#: before), deleting a failed take (or a replaced snapshot's data objects), listing.
STORAGE_POINTS = ("write", "write_exclusive", "replace", "read", "discard", "list")
RENDEZVOUS_POINTS = ("gather", "settle")
KINDS = ("fail", "fail_after", "interrupt", "interrupt_after", "delay")


@dataclasses.dataclass(frozen=True)
class Fault:
    """What happens at ``point`` on ``rank``: one of :data:`KINDS`."""

    point: str
    kind: str
    rank: int = 0

    def __str__(self) -> str:
        return f"{self.kind}@{self.point}/r{self.rank}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One take, with its faults (none: a clean take)."""

    faults: tuple[Fault, ...]

    def __str__(self) -> str:
        return "+".join(map(str, self.faults)) or "clean"


def cases_for(world_size: int) -> list[Case]:
    """Every single fault at every step on every rank, and the combinations that reach the
    steps a single fault cannot (the manifest read-back, deleting after a failure)."""
    cases = [Case(())]
    for rank in range(world_size):
        for kind in ("fail", "fail_after", "interrupt", "delay"):
            cases.append(Case((Fault("write", kind, rank),)))
        for point in RENDEZVOUS_POINTS:
            for kind in KINDS:
                cases.append(Case((Fault(point, kind, rank),)))
        cases.append(Case((Fault("write", "fail", rank), Fault("discard", "fail", rank))))
        cases.append(Case((Fault("write", "fail", rank), Fault("discard", "interrupt", rank))))
    for kind in KINDS:
        cases.append(Case((Fault("write_exclusive", kind),)))
    for after in ("fail_after", "interrupt_after", "interrupt"):
        for read in ("fail", "interrupt"):
            cases.append(Case((Fault("write_exclusive", after), Fault("read", read))))
    return cases


def _raise(fault: Fault, where: str) -> None:
    if fault.kind.startswith("interrupt"):
        raise KeyboardInterrupt(f"injected Ctrl-C at {where}")
    if fault.point in RENDEZVOUS_POINTS:
        raise RuntimeError(f"injected: the process group's store went away at {where}")
    raise OSError(errno.EIO, f"injected I/O error at {where}")


def _matching(faults: Sequence[Fault], rank: int, point: str) -> Fault | None:
    return next((f for f in faults if f.rank == rank and f.point == point), None)


#: Set once this process's take started writing its manifest (cleared for every case).
_COMMIT_STARTED = threading.Event()


class FaultyStore(StoragePlugin):
    """The fs plugin with this rank's storage faults."""

    def __init__(self, root: str, faults: Sequence[Fault], rank: int, delay_s: float) -> None:
        self.inner = FSStoragePlugin(root)
        self.capabilities = self.inner.capabilities
        self.faults = faults
        self.rank = rank
        self.delay_s = delay_s

    async def _call(self, point: str, where: str, call: Any) -> Any:
        fault = _matching(self.faults, self.rank, point)
        if fault is None:
            return await call()
        if fault.kind == "delay":
            await asyncio.sleep(self.delay_s)
            return await call()
        if fault.kind.endswith("_after"):
            await call()
        _raise(fault, f"{point} {where}")

    async def write(self, location: str, data: Any) -> None:
        point = "write" if location.startswith("data/") else "other"
        await self._call(point, location, lambda: self.inner.write(location, data))

    async def write_exclusive(self, location: str, data: Any) -> None:
        _COMMIT_STARTED.set()
        await self._call("write_exclusive", location, lambda: self.inner.write_exclusive(location, data))

    async def replace(self, location: str, data: Any) -> None:
        _COMMIT_STARTED.set()
        await self._call("replace", location, lambda: self.inner.replace(location, data))

    async def read(self, location: str, byte_range: Any = None) -> bytes | memoryview:
        point = "read" if location == METADATA_FILENAME and _COMMIT_STARTED.is_set() else "other"
        result: bytes | memoryview = await self._call(point, location, lambda: self.inner.read(location, byte_range))
        return result

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        await self.inner.read_into(location, start, buffers)

    async def exists(self, location: str) -> bool:
        return await self.inner.exists(location)

    async def list(self, prefix: str = "") -> list[str]:
        found: list[str] = await self._call("list", prefix, lambda: self.inner.list(prefix))
        return found

    async def delete(self, location: str) -> None:
        await self._call("discard", location, lambda: self.inner.delete(location))

    async def discard(self, locations: Sequence[str]) -> None:
        await self._call("discard", f"{len(locations)} objects", lambda: self.inner.discard(locations))

    async def close(self) -> None:
        await self.inner.close()


@dataclasses.dataclass(frozen=True)
class FaultyStoreFactory:
    """Picklable: the checkpoint daemon gets it with the rank whose faults it carries."""

    faults: tuple[Fault, ...]
    rank: int
    delay_s: float

    def __call__(self, root: str, storage_options: Mapping[str, Any]) -> StoragePlugin:
        return FaultyStore(root, self.faults, self.rank, self.delay_s)


_ORIGINALS = {
    (cls, name): getattr(cls, name)
    for cls in (rendezvous.CollectiveRendezvous, rendezvous.StoreRendezvous)
    for name in RENDEZVOUS_POINTS
}


def _wrap(original: Any, point: str, faults: Sequence[Fault], rank: int, delay_s: float) -> Any:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        fault = _matching(faults, rank, point)
        if fault is not None and fault.kind == "delay":
            time.sleep(delay_s)
        elif fault is not None and not fault.kind.endswith("_after"):
            _raise(fault, point)
        result = original(self, *args, **kwargs)
        if fault is not None and fault.kind.endswith("_after"):
            _raise(fault, f"{point} (after it completed)")
        return result

    return step


@dataclasses.dataclass
class installed_faults:
    """Install ``faults`` for ``rank`` (storage scheme and rendezvous steps); undone on exit."""

    faults: tuple[Fault, ...]
    rank: int
    delay_s: float

    def __enter__(self) -> None:
        _COMMIT_STARTED.clear()
        register_storage_plugin(SCHEME, FaultyStoreFactory(self.faults, self.rank, self.delay_s))
        for (cls, name), original in _ORIGINALS.items():
            setattr(cls, name, _wrap(original, name, self.faults, self.rank, self.delay_s))

    def __exit__(self, *exc: object) -> None:
        from snapshotkit.storage import _registry

        for (cls, name), original in _ORIGINALS.items():
            setattr(cls, name, original)
        _registry._registered.pop(SCHEME, None)


def app_state(rank: int, case: int) -> dict[str, Any]:
    """Distinct values on every rank and case; ``shared`` is alike on every rank (replicated)."""
    generator = torch.Generator().manual_seed(1000 * case + rank)
    return {
        "model": StateDict(w=torch.randn(64, 64, generator=generator), step=case),
        "shared": StateDict(t=torch.arange(2048, dtype=torch.float32) + case),
    }


def _blank(rank: int, case: int) -> dict[str, Any]:
    state = app_state(rank, case)
    state["model"]["w"].zero_()
    state["model"]["step"] = -1
    state["shared"]["t"].zero_()
    return state


@dataclasses.dataclass(frozen=True)
class Ended:
    """How one rank's call of one case ended: ``"ok"`` or the exception's class, and its text."""

    how: str
    text: str = ""
    seconds: float = 0.0


def take_one(path: str, state: dict[str, Any], mode: str, pg: Any) -> None:
    """Take ``state`` at ``path``: ``mode`` is ``"sync"``, or an ``async_take`` executor."""
    if mode == "sync":
        Snapshot.take(f"{SCHEME}://{path}", state, pg=pg, replicated=["shared/**"])
    else:
        Snapshot.async_take(f"{SCHEME}://{path}", state, pg=pg, replicated=["shared/**"], executor=mode).wait()


def run_cases(
    rank: int, cases: Sequence[Case], root: str, mode: str, delay_s: float, new_group: Any = None
) -> list[Ended]:
    """Take one snapshot per case on this rank (``new_group()``: a fresh process group for each
    case, since a timed-out collective leaves its group unusable); how each call ended."""
    ended = []
    for index, case in enumerate(cases):
        pg = new_group() if new_group is not None else None
        started = time.monotonic()
        with installed_faults(case.faults, rank, delay_s):
            try:
                take_one(f"{root}/case_{index}", app_state(rank, index), mode, pg)
                how, text = "ok", ""
            except BaseException as exc:
                how, text = type(exc).__name__, str(exc)
        ended.append(Ended(how, text, time.monotonic() - started))
    return ended


def restore_committed(rank: int, count: int, root: str, pg: Any = None) -> dict[int, bool]:
    """For every case that committed: whether this rank's restore gave back exactly its state."""
    restored = {}
    for index in range(count):
        path = f"{root}/case_{index}"
        if not committed(path):
            continue
        state = _blank(rank, index)
        Snapshot(path, pg=pg).restore(state)
        expected = app_state(rank, index)
        restored[index] = (
            torch.equal(state["model"]["w"], expected["model"]["w"])
            and state["model"]["step"] == index
            and torch.equal(state["shared"]["t"], expected["shared"]["t"])
        )
    return restored


def committed(path: str) -> bool:
    return Path(path, METADATA_FILENAME).exists()


def check_invariant(
    cases: Sequence[Case], root: str, ended: Sequence[Sequence[Ended]], restored: Sequence[Mapping[int, bool]]
) -> list[str]:
    """The protocol's promise for every case (module docstring); the broken ones, described."""
    broken = []
    for index, case in enumerate(cases):
        path = f"{root}/case_{index}"
        how = [ranks[index] for ranks in ended]
        if committed(path):
            report = verify_snapshot(path)
            if not report.ok:
                broken.append(f"case {index} ({case}): committed but verify found {report.problems[:3]}; ranks: {how}")
            if not all(r.get(index, False) for r in restored):
                broken.append(f"case {index} ({case}): committed but does not restore bit-exact; ranks: {how}")
        elif any(e.how == "ok" for e in how):
            broken.append(f"case {index} ({case}): a rank returned normally but nothing was committed; ranks: {how}")
        if not case.faults and not (committed(path) and all(e.how == "ok" for e in how)):
            broken.append(f"case {index} (clean): did not commit on every rank; ranks: {how}")
    return broken


def expect_committed(cases: Sequence[Case], root: str) -> Iterator[str]:
    """The cases whose fault comes after rank 0's manifest write took effect: they must commit."""
    for index, case in enumerate(cases):
        written = any(f.point == "write_exclusive" and f.kind.endswith("_after") for f in case.faults)
        if written and not committed(f"{root}/case_{index}"):
            yield f"case {index} ({case}): the manifest was written, but is gone"


def leftovers(root: str) -> list[str]:
    """Files below ``root`` (for the record: leftovers of unknown outcomes are allowed)."""
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)
