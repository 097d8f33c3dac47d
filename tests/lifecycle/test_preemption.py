"""Preemption notices: signals make ``should_save`` true, the save is recorded as a preemption's,
previous handlers are chained and put back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle._runs import memory_root
from snapshotkit import SnapshotManager, StateDict
from snapshotkit._lifecycle.catalog import MANAGER_KEY
from snapshotkit.errors import ConfigError, InvalidArgumentError


def test_a_signal_makes_the_next_should_save_true_once() -> None:
    calls: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        calls.append(signum)

    before = signal.signal(signal.SIGUSR1, previous)
    try:
        mgr = SnapshotManager(memory_root("signal"), save_interval_steps=100)
        assert not mgr.should_save(1) and not mgr.preemption_received
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1]  # chained
        assert mgr.preemption_received and not mgr.preemption_saved
        assert mgr.should_save(2)
        snap = mgr.save(2, {"s": StateDict(step=2)})
        assert snap.metadata.user_metadata[MANAGER_KEY]["reason"] == "preemption"
        assert mgr.preemption_saved
        assert not mgr.should_save(3)  # saved for this notice
        assert mgr.should_save(100)
        mgr.close()
        assert signal.getsignal(signal.SIGUSR1) is previous  # put back
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_managers_closed_in_any_order_never_swallow_a_signal() -> None:
    calls: list[int] = []

    def original(signum: int, frame: Any) -> None:
        calls.append(signum)

    before = signal.signal(signal.SIGUSR1, original)
    try:
        first = SnapshotManager(memory_root("first"), preemption_signals=(signal.SIGUSR1,))
        second = SnapshotManager(memory_root("second"), preemption_signals=(signal.SIGUSR1,))
        first.close()  # not the installed handler any more: it stays in the chain, passing signals on
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1]
        assert second.preemption_received and not first.preemption_received
        second.close()  # puts back first's handler, which is closed: it passes on to the original
        os.kill(os.getpid(), signal.SIGUSR1)
        assert calls == [signal.SIGUSR1, signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_request_preemption_and_no_signals() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with SnapshotManager(memory_root("manual"), preemption_signals=()) as mgr:
        assert signal.getsignal(signal.SIGTERM) == before
        assert not mgr.should_save(1)
        mgr.request_preemption()
        assert mgr.should_save(1)


def test_one_rank_reads_the_notice_at_every_call_whatever_check_every() -> None:
    with SnapshotManager(memory_root("every"), preemption_signals=(), preemption_check_every=50) as mgr:
        assert not mgr.should_save(1)
        mgr.request_preemption()
        assert mgr.preemption_received
        assert mgr.should_save(2)  # not 50 calls later: one rank needs no agreement


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ConfigError, "preemption_check_every must be at least 1, got 0"),
        (-3, ConfigError, "preemption_check_every must be at least 1, got -3"),
        ("10", InvalidArgumentError, "preemption_check_every must be an int (calls of should_save between "),
        (True, InvalidArgumentError, "preemption_check_every must be an int"),
        (2.0, InvalidArgumentError, "preemption_check_every must be an int"),
    ],
)
def test_preemption_check_every_is_checked_before_anything_happens(
    value: object, error: type[Exception], message: str
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(error) as caught:
        SnapshotManager(memory_root("check-every"), preemption_check_every=value)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)
    assert signal.getsignal(signal.SIGTERM) == before  # no handler was installed


def test_created_off_the_main_thread_watches_nothing() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    made: list[SnapshotManager] = []
    thread = threading.Thread(target=lambda: made.append(SnapshotManager(memory_root("thread"))))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGUSR1) == before
    made[0].close()


CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from snapshotkit import SnapshotManager, StateDict

    root = sys.argv[1]
    state = {"w": StateDict(w=torch.zeros(4), step=0)}
    mgr = SnapshotManager(root, keep_last=2, save_interval_steps=1000)
    step = mgr.restore_latest(state) or 0
    print("ready", flush=True)
    while step < 100_000:
        state["w"]["w"] += 1
        step += 1
        state["w"]["step"] = step
        if mgr.should_save(step):
            mgr.save(step, state, async_take=True)
        if mgr.preemption_saved:
            break
        time.sleep(0.001)
    mgr.close()
    print(json.dumps({"step": step}), flush=True)
    """
)


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_and_the_job_resumes_there(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped = json.loads(out.strip().splitlines()[-1])["step"]
    assert 0 < stopped < 100_000

    state = {"w": StateDict(w=torch.zeros(4), step=0)}
    with SnapshotManager(root) as mgr:
        assert mgr.latest_step() == stopped
        assert mgr.restore_latest(state) == stopped
        assert mgr.snapshot(stopped).metadata.user_metadata[MANAGER_KEY]["reason"] == "preemption"
    assert state["w"]["step"] == stopped and float(state["w"]["w"][0]) == stopped
