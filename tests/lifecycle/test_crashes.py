"""kill -9 during a managed save, a deletion and a clean-up: the newest complete snapshot restores
bit-exact, and nothing that does not open as complete is ever restored.

Children come from a forkserver that imported torch and snapshotkit once (a fork of the test
process could inherit a lock held by one of its threads). ``SNAPSHOTKIT_TEST_KILL_TRIALS`` sets
the number of trials per case (20 by default).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle import _crash_child as child
from snapshotkit import SnapshotManager

pytestmark = pytest.mark.slow

multiprocessing.set_forkserver_preload(["torch", "snapshotkit"])
TRIALS = int(os.environ.get("SNAPSHOTKIT_TEST_KILL_TRIALS", "20"))
MANIFEST = ".snapshot_metadata"


def kill_at_random(target: Any, args: tuple[Any, ...], window_s: float, rng: random.Random) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ready = ctx.Event()
    proc = ctx.Process(target=target, args=(*args[:1], ready, *args[1:]), daemon=True)
    proc.start()
    try:
        assert ready.wait(60), "the child never got ready"
        time.sleep(rng.uniform(0, window_s))
    finally:
        proc.kill()
        proc.join(30)
    assert proc.exitcode == -9, f"the child ended before the kill (exit code {proc.exitcode})"


def committed_steps(root: Path) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("step_")) for p in root.glob(f"step_*/{MANIFEST}"))


def check_resume(root: Path) -> int | None:
    """restore_latest restores the newest committed step, bit for bit; every committed one opens."""
    expected = committed_steps(root)
    state = child.state_for(0)
    with SnapshotManager(str(root), preemption_signals=()) as mgr:
        step = mgr.restore_latest(state)
        assert mgr.steps() == expected
    assert step == (expected[-1] if expected else None)
    if step is not None:
        assert state["s"]["step"] == step
        for name, tensor in child.values(step).items():
            assert torch.equal(state["s"][name], tensor), f"{name} of step {step} differs"
    # what is left opens as complete or not at all: nothing incomplete survives a manager's opening
    left = sorted(int(p.name.removeprefix("step_")) for p in root.iterdir()) if root.exists() else []
    assert left == expected
    return step


@pytest.mark.parametrize(
    ("case", "async_take", "keep_last", "window_s"),
    [("save", True, 3, 0.6), ("deletion", False, 1, 0.6)],
)
def test_kill_during_save_or_deletion(
    tmp_path: Path, case: str, async_take: bool, keep_last: int | None, window_s: float
) -> None:
    rng = random.Random(f"{case}-{TRIALS}")
    outcomes = []
    for trial in range(TRIALS):
        root = tmp_path / f"{case}-{trial}"
        kill_at_random(child.save_forever, (str(root), async_take, keep_last), window_s, rng)
        outcomes.append(check_resume(root))
        shutil.rmtree(root, ignore_errors=True)
    assert any(step is not None for step in outcomes), "every kill came before the first commit"


def test_kill_during_cleanup(tmp_path: Path) -> None:
    rng = random.Random(f"cleanup-{TRIALS}")
    template = tmp_path / "template"
    child.make_root(str(template), committed=[1, 2], incomplete=[3, 4, 5, 6])
    for trial in range(TRIALS):
        root = tmp_path / f"cleanup-{trial}"
        shutil.copytree(template, root)
        kill_at_random(child.open_and_clean, (str(root),), 0.3, rng)
        assert check_resume(root) == 2
        shutil.rmtree(root, ignore_errors=True)
