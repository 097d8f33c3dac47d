"""Storage plugins with injected behaviour, importable by name (the checkpoint daemon of
``async_take(executor="process")`` re-creates registered plugins from their factories).

They are real file-system plugins with one twist each: ``slow://`` sleeps before every data
object write (``SNAPSHOTKIT_TEST_WRITE_DELAY`` seconds, default 0.2) and records when each write
finished; ``failing://`` raises ``OSError(ENOSPC)`` on data object writes (on every rank, or only on
rank ``SNAPSHOTKIT_TEST_FAIL_RANK``).
"""

from __future__ import annotations

import asyncio
import errno
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


def slow_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return SlowPlugin(root)


def failing_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return FailingPlugin(root)


def register() -> None:
    register_storage_plugin("slow", slow_factory)
    register_storage_plugin("failing", failing_factory)


def write_times(path: str) -> Sequence[float]:
    log = Path(path).parent / f"{Path(path).name}.writes"
    return [float(line) for line in log.read_text().split()] if log.exists() else []
