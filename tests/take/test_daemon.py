"""The checkpoint daemon of ``async_take(executor="process")`` after failed writes: it exits
cleanly, with nothing on its stderr."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.mark.parametrize("error", ["OSError", "RuntimeError"])
def test_daemon_exits_cleanly_after_failed_writes(tmp_path: Path, error: str) -> None:
    # Before: the frames of the failed write kept views of the shared-memory segment alive, and
    # the daemon raised "BufferError: cannot close exported pointers exist" at exit.
    path = tmp_path / "snap"
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        import _foreign_storage
        _foreign_storage.register()
        from snapshotkit import Snapshot, StateDict
        from snapshotkit._take import executors
        from snapshotkit.errors import StorageError
        options = {{"fail": "data-write", "error": {error!r}}}
        for attempt in range(3):
            state = StateDict(**{{f"t{{i}}": torch.full((300_000,), float(i)) for i in range(4)}})
            uri = "foreign://{path}"
            pending = Snapshot.async_take(uri, {{"s": state}}, storage_options=options, executor="process")
            try:
                pending.wait()
            except StorageError:
                pass
        [daemon] = [w for w in executors._writers.values() if w.name == "process"]
        executors.shutdown_writers()
        print("daemon exit code", daemon.process.returncode, flush=True)
        """
    )
    env = {**os.environ, "SNAPSHOTKIT_DATA_OBJECT_BYTES": str(1 << 20)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "daemon exit code 0", done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # the daemon shares this stderr: no BufferError, no traceback
    assert not path.exists() or not any(path.rglob("*.snapshot_metadata"))


def test_daemon_imports_the_trainers_snapshotkit_not_one_in_the_working_directory(tmp_path: Path) -> None:
    # Before: the daemon was started with `python -c`, which puts the working directory first on
    # sys.path, so a `snapshotkit` folder there (a source checkout, another version) shadowed the
    # one the trainer imported, and the daemon exited with code 1 before writing anything.
    decoy = tmp_path / "cwd" / "snapshotkit"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy snapshotkit was imported')\n")
    script = textwrap.dedent(
        f"""
        import torch
        from snapshotkit import Snapshot, StateDict
        state = {{"s": StateDict(w=torch.ones(8))}}
        pending = Snapshot.async_take({str(tmp_path / "snap")!r}, state, executor="process")
        pending.wait()
        print("committed")
        """
    )
    (tmp_path / "train.py").write_text(script)  # a script: its own folder, not the working directory, on sys.path
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")],
        cwd=tmp_path / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert "committed" in proc.stdout, proc.stderr[-2000:]


def test_a_kill_of_every_process_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    # Before: the pooled segments had names in /dev/shm until the trainer unlinked them (or its
    # resource tracker did, at exit); a kill -9 of the whole process group (trainer, daemon and
    # tracker) left them there for good, up to the staging budget each time.
    script = textwrap.dedent(
        f"""
        from multiprocessing import shared_memory
        import torch
        from snapshotkit import Snapshot, StateDict
        made, init = [], shared_memory.SharedMemory.__init__
        def record(self, *args, **kwargs):
            init(self, *args, **kwargs)
            made.append(self.name)
        shared_memory.SharedMemory.__init__ = record
        state = StateDict(**{{f"t{{i}}": torch.full((300_000,), float(i)) for i in range(4)}})
        Snapshot.async_take({str(tmp_path / "snap")!r}, {{"s": state}}, executor="process").wait()
        print(" ".join(made), flush=True)  # pooled now, mapped by the trainer and the daemon
        input()  # killed here
        """
    )
    env = {**os.environ, "SNAPSHOTKIT_DATA_OBJECT_BYTES": str(1 << 20)}
    with subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill takes the daemon and the tracker too
    ) as child:
        try:
            assert child.stdout is not None
            names = child.stdout.readline().split()
        finally:
            os.killpg(child.pid, signal.SIGKILL)
    assert names, "no segment was pooled"
    assert [name for name in names if Path("/dev/shm", name).exists()] == []
    shutil.rmtree(tmp_path / "snap")
