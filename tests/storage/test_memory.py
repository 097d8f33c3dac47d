"""The in-process memory plugin against the storage conformance suite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from snapshotkit.storage import MemoryStoragePlugin, StoragePlugin
from snapshotkit.storage._memory import _STORE, _STORE_LOCK
from snapshotkit.testing import StoragePluginConformance


class TestMemoryStoragePlugin(StoragePluginConformance):
    @pytest.fixture
    def root(self) -> Iterator[str]:
        root = f"conformance-{uuid.uuid4().hex}"
        yield root
        with _STORE_LOCK:
            for key in [k for k in _STORE if k.startswith(f"{root}/")]:
                del _STORE[key]

    async def make_plugin(self, root: str) -> StoragePlugin:
        return MemoryStoragePlugin(root)

    def uri(self, root: str) -> str:
        return f"memory://{root}"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        with _STORE_LOCK:
            _STORE[f"{root}/{location}"] = bytes(data)

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        with _STORE_LOCK:
            return _STORE.get(f"{root}/{location}")
