"""The commit protocol under a failure, Ctrl-C or a delay at every step, on every rank.

For 1, 2 and 3 ranks, ``take`` and both ``async_take`` executors: after each case, either no
manifest exists, or the snapshot verifies and restores bit-exact on every rank; a take that
returned normally on any rank committed; a fault after the manifest write took effect leaves a
committed snapshot (with its data); and no rank hangs. Multi-rank cases run on real gloo ranks,
one fresh process group per case (a timed-out collective leaves its group unusable).
"""

from __future__ import annotations

import datetime
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from multirank._harness import run_ranks

from ._commit_faults import (
    Ended,
    app_state,
    cases_for,
    check_invariant,
    expect_committed,
    installed_faults,
    restore_committed,
    run_cases,
    take_one,
)

pytestmark = pytest.mark.usefixtures("clean_env")

MODES = ["sync", "thread", "process"]
#: The collective timeout of the multi-rank cases, and the injected delay that outlasts it.
TIMEOUT_S = 1.0
DELAY_S = 1.6
#: A take that ends later than this hangs (generous: a few collective timeouts and the delay,
#: plus starting the checkpoint daemon on a loaded machine; a real hang is forever).
HANG_S = 60.0


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    # A process started by a non-interactive shell may ignore SIGINT; the injected interrupts do
    # not need it, but the loop's own handling of KeyboardInterrupt must be the default one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _assert_holds(cases: Any, root: str, ended: list[list[Ended]], restored: list[dict[int, bool]]) -> None:
    broken = check_invariant(cases, root, ended, restored)
    broken += list(expect_committed(cases, root))
    slow = [(i, str(c), e) for ranks in ended for i, (c, e) in enumerate(zip(cases, ranks)) if e.seconds > HANG_S]
    assert not slow, f"takes that hung: {slow}"
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("mode", MODES)
def test_one_rank_every_fault_keeps_the_invariant(tmp_path: Path, mode: str, sigint_raises: None) -> None:
    cases = cases_for(1)
    root = str(tmp_path)
    ended = run_cases(0, cases, root, mode, delay_s=0.05)
    restored = restore_committed(0, len(cases), root)
    _assert_holds(cases, root, [ended], [restored])
    # The faults did reach the protocol: the clean case committed, the failing ones did not all.
    assert ended[0].how == "ok"
    assert {e.how for e in ended} >= {"ok", "KeyboardInterrupt", "StorageError"}


def _ranks_target(rank: int, world: int, root: str, mode: str, cases: Any) -> tuple[list[Ended], dict[int, bool]]:
    def new_group() -> Any:
        return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=30))

    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A first take of its own starts the checkpoint daemon (process executor) and warms the
    # imports, under a timeout a loaded machine meets, so the 1 s timeout of the cases measures
    # the protocol, not a process start (the clean case timed out once, in CI under load).
    os.environ["SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS"] = "60"
    with installed_faults((), rank, DELAY_S):
        take_one(f"{root}/warm-up", app_state(rank, 0), mode, new_group())
    os.environ["SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS"] = str(TIMEOUT_S)
    ended = run_cases(rank, cases, root, mode, DELAY_S, new_group)
    restored = restore_committed(rank, len(cases), root, new_group())
    return ended, restored


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [2, 3])
def test_many_ranks_every_fault_on_every_rank_keeps_the_invariant(tmp_path: Path, world: int, mode: str) -> None:
    cases = cases_for(world)
    root = str(tmp_path)
    results = run_ranks(
        world,
        _ranks_target,
        root,
        mode,
        cases,
        timeout=800,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": str(TIMEOUT_S)},
    )
    ended = [r[0] for r in results]
    restored = [r[1] for r in results]
    _assert_holds(cases, root, ended, restored)


def test_two_ranks_the_reported_cases_keep_their_data(tmp_path: Path) -> None:
    """The two reproductions of the issue, on 2 gloo ranks, in the default quick run: Ctrl-C just
    after rank 0's manifest write, and a manifest write slower than the collective timeout."""
    from ._commit_faults import Case, Fault

    cases = [
        Case((Fault("write_exclusive", "interrupt_after"),)),
        Case((Fault("write_exclusive", "delay"),)),
    ]
    root = str(tmp_path)
    results = run_ranks(
        2,
        _ranks_target,
        root,
        "sync",
        cases,
        timeout=120,
        env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": str(TIMEOUT_S)},
    )
    ended = [r[0] for r in results]
    _assert_holds(cases, root, ended, [r[1] for r in results])
    assert ended[0][0].how == "KeyboardInterrupt" and ended[1][0].how == "ok"
    assert ended[0][1].how == "ok" and ended[1][1].how == "CollectiveTimeoutError"
    assert "data objects were kept" in ended[1][1].text
