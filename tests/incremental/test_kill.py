"""kill -9 during incremental takes: the base still restores bit-exact, and each target either is
not a snapshot at all or restores bit-exact (never a snapshot with references that do not read)."""

from __future__ import annotations

import multiprocessing
import random
import shutil
import time
from pathlib import Path

import pytest

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import SnapshotNotFoundError

from . import _children as child
from ._incremental import assert_bit_exact

pytestmark = pytest.mark.slow

multiprocessing.set_forkserver_preload(["torch", "snapshotkit"])
TRIALS = 6
ENV = {"SNAPSHOTKIT_CHUNK_BYTES": str(256 * 1024), "SNAPSHOTKIT_MIN_REFERENCE_BYTES": str(64 * 1024)}


def _kill_at_random(root: Path, rng: random.Random) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ready = ctx.Event()
    proc = ctx.Process(target=child.take_incremental_forever, args=(str(root), ready, ENV), daemon=True)
    proc.start()
    try:
        assert ready.wait(60), "the child never got ready"
        time.sleep(rng.uniform(0, 1.0))
    finally:
        proc.kill()
        proc.join(30)
    assert proc.exitcode == -9, f"the child ended before the kill (exit code {proc.exitcode})"


def test_kill_during_incremental_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    rng = random.Random(f"incremental-kill-{TRIALS}")
    committed = 0
    for trial in range(TRIALS):
        root = tmp_path / f"trial-{trial}"
        Snapshot.take(str(root / "base"), {"s": StateDict(**child.values(0))})
        _kill_at_random(root, rng)
        assert_bit_exact(Snapshot(str(root / "base")).read_object("s"), child.values(0))
        for target in sorted(root.glob("t*")):
            step = int(target.name[1:])
            try:
                loaded = Snapshot(str(target)).read_object("s")
            except SnapshotNotFoundError:  # IncompleteSnapshotError too: the take never committed
                continue
            committed += 1
            assert_bit_exact(loaded, child.values(step), target.name)
            assert Snapshot(str(target)).metadata.bases, "an incremental take referenced nothing"
        shutil.rmtree(root)
    assert committed, "every kill came before the first commit"
