"""Storage plugins with injected behaviour, importable by name (the checkpoint daemon of
``async_take(executor="process")`` re-creates registered plugins from their factories).

They are real file-system plugins with one twist each: ``slow://`` sleeps before every data
object write (``SNAPSHOTKIT_TEST_WRITE_DELAY`` seconds, default 0.2) and records when each write
finished; ``failing://`` raises ``OSError(ENOSPC)`` on data object writes (on every rank, or only on
rank ``SNAPSHOTKIT_TEST_FAIL_RANK``); ``gated://`` holds every data object write at a
:class:`Gate` (the storage option ``"gate"``: its path) until the test opens it, in this process
or in the checkpoint daemon.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snapshotkit.storage import FSStoragePlugin, StoragePlugin, register_storage_plugin


class SlowPlugin(FSStoragePlugin):
    async def write(self, location: str, data: Any) -> None:
        if location.startswith("data/"):
            await asyncio.sleep(float(os.environ.get("SNAPSHOTKIT_TEST_WRITE_DELAY", "0.2")))
        await super().write(location, data)
        if location.startswith("data/"):
            log = Path(self.root).parent / f"{Path(self.root).name}.writes"
            with open(log, "a") as f:
                f.write(f"{time.monotonic()}\n")


class FailingPlugin(FSStoragePlugin):
    """Fails data object writes; only on rank ``SNAPSHOTKIT_TEST_FAIL_RANK`` when that is set."""

    async def write(self, location: str, data: Any) -> None:
        only = os.environ.get("SNAPSHOTKIT_TEST_FAIL_RANK")
        if location.startswith("data/") and only in (None, os.environ.get("RANK")):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        await super().write(location, data)


class Gate:
    """A gate across processes: a file the test holds an exclusive lock on while it is closed.

    ``with Gate(path) as gate:`` closes it; ``gate.open()`` lets every held and later write through.
    """

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._fd: int | None = None

    def __enter__(self) -> Gate:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def open(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def __exit__(self, *exc_info: object) -> None:
        self.open()
        os.unlink(self.path)


def _pass(gate: str) -> None:
    try:
        fd = os.open(gate, os.O_RDONLY)
    except FileNotFoundError:  # the test is done with the gate: open
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while the test holds the gate closed
    finally:
        os.close(fd)


class GatedPlugin(FSStoragePlugin):
    """Data object writes wait until the gate at ``gate`` (a :class:`Gate`'s path) is open; with
    ``fail``, they then raise ``OSError(ENOSPC)``."""

    def __init__(self, root: str, gate: str | None, fail: bool = False) -> None:
        super().__init__(root)
        self.gate = gate
        self.fail = fail

    async def write(self, location: str, data: Any) -> None:
        if location.startswith("data/") and self.gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, _pass, self.gate)
            if self.fail:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
        await super().write(location, data)


def gated_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return GatedPlugin(root, options.get("gate"), bool(options.get("fail")))


def slow_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return SlowPlugin(root)


def failing_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return FailingPlugin(root)


def register() -> None:
    register_storage_plugin("slow", slow_factory)
    register_storage_plugin("failing", failing_factory)
    register_storage_plugin("gated", gated_factory)


def write_times(path: str) -> Sequence[float]:
    log = Path(path).parent / f"{Path(path).name}.writes"
    return [float(line) for line in log.read_text().split()] if log.exists() else []
