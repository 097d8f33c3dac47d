"""A take replacing the snapshot at its path, with a failure, Ctrl-C or a delay at each storage call
and rendezvous step (the fault machinery of ``_commit_faults``), and killed with SIGKILL: the
path always opens, and restores bit-exact, as the old snapshot or the new one (never neither,
never a mix), and verifies; a replace that returned normally, or whose manifest write took
effect, is the new one.

Before: ``SnapshotCheckpointIO`` deleted the old snapshot and then took the new one, so any
failure of the take (and a kill during it) left nothing at the path.
"""

from __future__ import annotations

import datetime
import multiprocessing
import random
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from multirank._harness import run_ranks

from snapshotkit import Snapshot
from snapshotkit._format.entries import pieces_of
from snapshotkit.verify import verify_snapshot

from . import _replace_child as child
from ._commit_faults import (
    KINDS,
    RENDEZVOUS_POINTS,
    SCHEME,
    Case,
    Ended,
    Fault,
    _blank,
    app_state,
    committed,
    installed_faults,
    leftovers,
)

pytestmark = pytest.mark.usefixtures("clean_env")

#: The old snapshot of case ``i`` holds ``app_state(rank, OLD + i)``, the new one ``app_state(rank, i)``.
OLD = 500
TIMEOUT_S = 1.0
DELAY_S = 1.6


def replace_cases(world_size: int) -> list[Case]:
    """Every single fault at every step of a replacing take on every rank, and the pairs that
    reach the manifest read-back and the deletes."""
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
        cases.append(Case((Fault("replace", kind),)))
    for after in ("fail_after", "interrupt_after", "interrupt"):
        for read in ("fail", "interrupt"):
            cases.append(Case((Fault("replace", after), Fault("read", read))))
    for kind in ("fail", "interrupt"):
        cases.append(Case((Fault("list", kind),)))  # rank 0's listing before anything is written
        cases.append(Case((Fault("discard", kind),)))  # deleting the old data objects after the commit
    return cases


def _replace(path: str, state: dict[str, Any], mode: str, pg: Any) -> None:
    if mode == "sync":
        Snapshot.take(f"{SCHEME}://{path}", state, pg=pg, replicated=["shared/**"], _replace=True)
    else:
        Snapshot.async_take(
            f"{SCHEME}://{path}", state, pg=pg, replicated=["shared/**"], executor=mode, _replace=True
        ).wait()


def run_replace_cases(
    rank: int, cases: Sequence[Case], root: str, mode: str, delay_s: float, new_group: Any = None
) -> list[Ended]:
    """For each case: take the old snapshot (no faults), then replace it with the case's faults."""
    ended = []
    for index, case in enumerate(cases):
        path = f"{root}/case_{index}"
        pg = new_group() if new_group is not None else None
        Snapshot.take(path, app_state(rank, OLD + index), pg=pg, replicated=["shared/**"])
        started = time.monotonic()
        with installed_faults(case.faults, rank, delay_s):
            try:
                _replace(path, app_state(rank, index), mode, pg)
                how, text = "ok", ""
            except BaseException as exc:
                how, text = type(exc).__name__, str(exc)
        ended.append(Ended(how, text, time.monotonic() - started))
    return ended


def _equal(restored: dict[str, Any], expected: dict[str, Any], step: int) -> bool:
    return (
        torch.equal(restored["model"]["w"], expected["model"]["w"])
        and restored["model"]["step"] == step
        and torch.equal(restored["shared"]["t"], expected["shared"]["t"])
    )


def restored_as(rank: int, count: int, root: str, pg: Any = None) -> list[str]:
    """For each case, what the path restores as on this rank: ``new``, ``old``, ``neither`` or ``missing``."""
    found = []
    for index in range(count):
        path = f"{root}/case_{index}"
        if not committed(path):
            found.append("missing")
            continue
        state = _blank(rank, index)
        Snapshot(path, pg=pg).restore(state)
        if _equal(state, app_state(rank, index), index):
            found.append("new")
        elif _equal(state, app_state(rank, OLD + index), OLD + index):
            found.append("old")
        else:
            found.append("neither")
    return found


def broken_cases(
    cases: Sequence[Case], root: str, ended: Sequence[Sequence[Ended]], found: Sequence[list[str]]
) -> list[str]:
    broken = []
    for index, case in enumerate(cases):
        path = f"{root}/case_{index}"
        how = [ranks[index] for ranks in ended]
        what = {ranks[index] for ranks in found}
        where = f"case {index} ({case}): ranks {how}"
        if len(what) != 1 or what - {"old", "new"}:
            broken.append(f"{where}: restores as {what}")
            continue
        if not verify_snapshot(path).ok:
            broken.append(f"{where}: verify failed")
        (outcome,) = what
        written = any(f.point == "replace" and f.kind.endswith("_after") for f in case.faults)
        if (written or any(e.how == "ok" for e in how)) and outcome != "new":
            broken.append(f"{where}: the new snapshot was committed or returned, but the path holds the old one")
        if not case.faults and not all(e.how == "ok" for e in how):
            broken.append(f"{where}: the clean case failed")
        if outcome == "new" and all(e.how == "ok" for e in how) and not any(f.point == "discard" for f in case.faults):
            manifest = Snapshot(path).metadata.manifest
            own = {p.location for entry in manifest.values() for p in pieces_of(entry) if p.base is None}
            if set(leftovers(path)) != {".snapshot_metadata", *own}:
                broken.append(f"{where}: left {sorted(set(leftovers(path)) - own)} beside the new snapshot")
    return broken


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_one_rank_every_fault_of_a_replace_leaves_the_old_or_the_new_snapshot(
    tmp_path: Path, mode: str, sigint_raises: None
) -> None:
    cases = replace_cases(1)
    root = str(tmp_path)
    ended = run_replace_cases(0, cases, root, mode, delay_s=0.05)
    found = restored_as(0, len(cases), root)
    broken = broken_cases(cases, root, [ended], [found])
    assert not broken, "\n".join(broken)
    assert ended[0].how == "ok"
    assert set(found) == {"old", "new"}  # the faults reached the protocol both before and after the commit
    assert {e.how for e in ended} >= {"ok", "KeyboardInterrupt", "StorageError"}


def _ranks_target(rank: int, world: int, root: str, mode: str, cases: Any) -> tuple[list[Ended], list[str]]:
    def new_group() -> Any:
        return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))

    signal.signal(signal.SIGINT, signal.default_int_handler)
    ended = run_replace_cases(rank, cases, root, mode, DELAY_S, new_group)
    return ended, restored_as(rank, len(cases), root, new_group())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_ranks_every_fault_of_a_replace_leaves_the_old_or_the_new_snapshot(tmp_path: Path) -> None:
    """On 2 gloo ranks with ``async_take`` (the store rendezvous); ``take``'s collectives are the
    same for a replacing take as for any other (``test_commit_faults``)."""
    cases = replace_cases(2)
    root = str(tmp_path)
    results = run_ranks(
        2,
        _ranks_target,
        root,
        "thread",
        cases,
        timeout=500,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": str(TIMEOUT_S)},
    )
    broken = broken_cases(cases, root, [r[0] for r in results], [r[1] for r in results])
    assert not broken, "\n".join(broken)


# ---------------------------------------------------------------- kill -9


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_save", [False, True])
def test_kill_during_checkpoint_io_saves_onto_last_ckpt_leaves_a_whole_checkpoint(
    tmp_path: Path, async_save: bool
) -> None:
    """A process saving ``last.ckpt`` again and again through ``SnapshotCheckpointIO`` is killed at
    a random instant: the path loads as one of the checkpoints it saved, whole."""
    rng = random.Random(f"replace-kill-{async_save}")
    ctx = multiprocessing.get_context("forkserver")
    saved = 0
    for trial in range(4):
        path = str(tmp_path / f"trial-{trial}" / "last.ckpt")
        ready = ctx.Event()
        proc = ctx.Process(target=child.save_forever, args=(path, async_save, ready), daemon=True)
        proc.start()
        try:
            assert ready.wait(120), "the child never saved its first checkpoint"
            time.sleep(rng.uniform(0, 1.5))
        finally:
            proc.kill()
            proc.join(30)
        assert proc.exitcode == -9, f"the child ended before the kill (exit code {proc.exitcode})"
        step = child.assert_whole(path)
        saved = max(saved, step)
        assert verify_snapshot(path).ok
    assert saved > 1, "every kill came before the second save"
