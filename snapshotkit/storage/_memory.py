"""An in-process storage plugin: objects live in a dict. For tests and ephemeral snapshots.

All ``memory://`` URIs of one process share one store, so a snapshot taken to
``memory://runs/a`` can be opened again by a later ``Snapshot("memory://runs/a")``. Other
processes do not see it (``capabilities.process_local``): ``async_take(executor="process")`` and
takes by several ranks refuse it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from snapshotkit.storage._base import ByteRange, Capabilities, StoragePlugin, as_buffers

if TYPE_CHECKING:
    from typing_extensions import Buffer

_STORE: dict[str, bytes] = {}
_STORE_LOCK = threading.Lock()


class MemoryStoragePlugin(StoragePlugin):
    """Objects in a process-wide dict, keyed by ``<root>/<location>``."""

    capabilities = Capabilities(atomic_exclusive_write=True, atomic_replace=True, listing=True, process_local=True)

    def __init__(self, root: str) -> None:
        self.root = root.strip("/")

    def _key(self, location: str) -> str:
        return f"{self.root}/{location}" if self.root else location

    async def write(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        payload = b"".join(as_buffers(data))
        with _STORE_LOCK:
            _STORE[self._key(location)] = payload

    async def write_exclusive(self, location: str, data: Buffer | Sequence[Buffer]) -> None:
        payload = b"".join(as_buffers(data))
        key = self._key(location)
        with _STORE_LOCK:
            if key in _STORE:
                raise FileExistsError(location)
            _STORE[key] = payload

    async def read(self, location: str, byte_range: ByteRange | None = None) -> bytes | memoryview:
        with _STORE_LOCK:
            try:
                payload = _STORE[self._key(location)]
            except KeyError:
                raise FileNotFoundError(location) from None
        if byte_range is None:
            return payload
        if byte_range.end > len(payload):
            raise EOFError(
                f"{location}: range [{byte_range.start}, {byte_range.end}) is past the end ({len(payload)} bytes)"
            )
        return memoryview(payload)[byte_range.start : byte_range.end]

    async def exists(self, location: str) -> bool:
        with _STORE_LOCK:
            return self._key(location) in _STORE

    async def delete(self, location: str) -> None:
        with _STORE_LOCK:
            try:
                del _STORE[self._key(location)]
            except KeyError:
                raise FileNotFoundError(location) from None

    async def list(self, prefix: str = "") -> list[str]:
        base = self._key("")
        with _STORE_LOCK:
            keys = list(_STORE)
        return sorted(k[len(base) :] for k in keys if k.startswith(base + prefix))

    async def close(self) -> None:
        return None
