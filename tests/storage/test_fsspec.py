"""The generic fsspec plugin passes the conformance suite through fsspec's ``local`` scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshotkit.storage import FsspecStoragePlugin, StoragePlugin, url_to_storage_plugin
from snapshotkit.testing import StoragePluginConformance

pytest.importorskip("fsspec", reason="the generic fsspec plugin needs fsspec installed")


class TestFsspecLocalPlugin(StoragePluginConformance):
    @pytest.fixture
    def root(self, tmp_path: Path) -> str:
        return str(tmp_path / "root")

    async def make_plugin(self, root: str) -> StoragePlugin:
        plugin = url_to_storage_plugin(self.uri(root))
        assert isinstance(plugin, FsspecStoragePlugin)
        return plugin

    def uri(self, root: str) -> str:
        return f"local://{root}"

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        path = Path(root, location)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        path = Path(root, location)
        return path.read_bytes() if path.is_file() else None
