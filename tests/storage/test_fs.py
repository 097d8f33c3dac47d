"""The local filesystem plugin against the storage conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshotkit.storage import FSStoragePlugin, StoragePlugin
from snapshotkit.testing import StoragePluginConformance


class TestFSStoragePlugin(StoragePluginConformance):
    @pytest.fixture
    def root(self, tmp_path: Path) -> str:
        return (tmp_path / "root").as_posix()

    async def make_plugin(self, root: str) -> StoragePlugin:
        return FSStoragePlugin(root)

    def uri(self, root: str) -> str:
        return f"file://{root}"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        path = Path(root, location)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        path = Path(root, location)
        return path.read_bytes() if path.is_file() else None
