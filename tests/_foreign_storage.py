"""``foreign://``: the local filesystem plugin with one storage call failing, as a plugin's own
exception (not a snapshotkit one). Importable by name, so the checkpoint daemon of
``async_take(executor="process")`` re-creates it from its registered factory.

Storage options choose the fault: ``fail`` names the call (:data:`CALLS`), ``error`` the
built-in exception class it raises (``"TimeoutError"``, ``"ConnectionResetError"``, ...).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotkit._runtime.loop import to_thread
from snapshotkit.storage import ByteRange, FSStoragePlugin, StoragePlugin, register_storage_plugin
from snapshotkit.storage._base import as_buffers

#: The calls that can be made to fail.
CALLS = ("open", "manifest-read", "data-read", "list", "exists", "data-write", "manifest-write")
#: The retry layer retries transient errors (timeouts, resets); retry them once, quickly.
FAST_RETRY = {"max_attempts": 2, "initial_delay_seconds": 0.01, "max_delay_seconds": 0.01}
#: The exception types a plugin typically lets through.
FOREIGN_ERRORS = ("TimeoutError", "ConnectionResetError", "OSError", "RuntimeError")


class ForeignErrorPlugin(FSStoragePlugin):
    def __init__(self, root: str, fail: str, error: str) -> None:
        super().__init__(root)
        assert fail in CALLS, fail
        self.fail = fail
        self.error: type[Exception] = getattr(builtins, error)
        self._maybe_fail("open", root)

    def _maybe_fail(self, call: str, location: str) -> None:
        if call == self.fail:
            raise self.error(f"injected {self.error.__name__} on {call} of {location}")

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        self._maybe_fail("manifest-read" if location == ".snapshot_metadata" else "data-read", location)
        return await super().read(location, byte_range)

    async def read_into(self, location: str, start: int, buffers: Sequence[memoryview]) -> None:
        self._maybe_fail("data-read", location)
        await super().read_into(location, start, buffers)

    async def list(self, prefix: str = "") -> list[str]:
        self._maybe_fail("list", prefix)
        return await super().list(prefix)

    async def exists(self, location: str) -> bool:
        self._maybe_fail("exists", location)
        return await super().exists(location)

    async def write(self, location: str, data: Any) -> None:
        # Fails in a worker thread, holding views of the data, as the filesystem plugin does on ENOSPC.
        views = as_buffers(data)
        await to_thread(self._maybe_fail_holding, "data-write", location, views)
        await super().write(location, views)

    def _maybe_fail_holding(self, call: str, location: str, views: list[memoryview]) -> None:
        self._maybe_fail(call, location)

    async def write_exclusive(self, location: str, data: Any) -> None:
        self._maybe_fail("manifest-write", location)
        await super().write_exclusive(location, data)


def foreign_factory(root: str, options: Mapping[str, Any]) -> StoragePlugin:
    return ForeignErrorPlugin(root, str(options.get("fail", "")), str(options.get("error", "OSError")))


def register() -> None:
    register_storage_plugin("foreign", foreign_factory)


def cause_names(exc: BaseException) -> list[str]:
    """Type names along the ``__cause__`` chain: a transient error (``TimeoutError``,
    ``ConnectionResetError``) is retried first, so it is the cause of a ``RetriesExhaustedError``."""
    names = []
    cause = exc.__cause__
    while cause is not None:
        names.append(type(cause).__name__)
        cause = cause.__cause__
    return names
