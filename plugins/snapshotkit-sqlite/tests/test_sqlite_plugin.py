"""snapshotkit-sqlite passes snapshotkit's storage plugin conformance suite, found through its entry point."""

from __future__ import annotations

import contextlib
import importlib.metadata
import sqlite3
from pathlib import Path

import pytest
import torch
from snapshotkit_sqlite import SQLiteStoragePlugin

from snapshotkit import Snapshot
from snapshotkit.errors import ConfigError, SnapshotExistsError, SnapshotNotFoundError, UnknownStorageSchemeError
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin
from snapshotkit.testing import StoragePluginConformance

GROUP = "snapshotkit.storage_plugins"


def _db_write(db: str, location: str, data: bytes) -> None:
    """Put a row with sqlite3 alone, creating the database and table the way the plugin documents them."""
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("CREATE TABLE IF NOT EXISTS objects (location TEXT PRIMARY KEY, data BLOB NOT NULL)")
        connection.execute("INSERT OR REPLACE INTO objects (location, data) VALUES (?, ?)", (location, data))


def _db_read(db: str, location: str) -> bytes | None:
    """A row's bytes read with sqlite3 alone; None if the database or the row is missing."""
    if not Path(db).is_file():
        return None
    with contextlib.closing(sqlite3.connect(db)) as connection:
        row = connection.execute("SELECT data FROM objects WHERE location = ?", (location,)).fetchone()
    return None if row is None else bytes(row[0])


def _db_locations(db: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        return [location for (location,) in connection.execute("SELECT location FROM objects ORDER BY location")]


class TestSQLitePlugin(StoragePluginConformance):
    """The whole conformance suite; the root is a database file, the plugin comes from the URI."""

    @pytest.fixture
    def root(self, tmp_path: Path) -> str:
        return (tmp_path / "conformance" / "snapshot.sqlite").as_posix()  # parent created on first write

    async def make_plugin(self, root: str) -> StoragePlugin:
        plugin = url_to_storage_plugin(self.uri(root))
        assert isinstance(plugin, SQLiteStoragePlugin)
        return plugin

    def uri(self, root: str) -> str:
        return f"sqlite://{root}"  # root is absolute: sqlite:///tmp/...

    def incremental_uris(self, root: str) -> tuple[str, str]:
        return self.uri(root), self.uri(root.removesuffix(".sqlite") + "-incremental.sqlite")  # beside it

    def ground_truth_write(self, root: str, location: str, data: bytes) -> None:
        _db_write(root, location, data)

    def ground_truth_read(self, root: str, location: str) -> bytes | None:
        return _db_read(root, location)


def test_the_sqlite_scheme_resolves_through_this_distributions_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    (entry_point,) = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == "sqlite"]
    assert entry_point.dist is not None
    assert entry_point.dist.name == "snapshotkit-sqlite"
    assert entry_point.load() is SQLiteStoragePlugin
    assert type(url_to_storage_plugin("sqlite:///nonexistent/dir/x.sqlite")) is SQLiteStoragePlugin
    with pytest.raises(UnknownStorageSchemeError, match="sqlite"):  # listed among the known schemes
        url_to_storage_plugin("nosuchscheme://x")

    # Nothing but the entry point serves the scheme: without it, resolution fails.
    real_entry_points = importlib.metadata.entry_points

    def entry_points_without_ours(**params: str) -> importlib.metadata.EntryPoints:
        return importlib.metadata.EntryPoints(ep for ep in real_entry_points(**params) if ep.name != "sqlite")

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points_without_ours)
    with pytest.raises(UnknownStorageSchemeError):
        url_to_storage_plugin("sqlite:///nonexistent/dir/x.sqlite")


def test_uri_root_is_the_database_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = url_to_storage_plugin(f"sqlite://{tmp_path}/a/b.sqlite")
    assert isinstance(absolute, SQLiteStoragePlugin)
    assert absolute.path == tmp_path / "a" / "b.sqlite"
    monkeypatch.chdir(tmp_path)
    relative = url_to_storage_plugin("sqlite://rel/c.sqlite", {"timeout": 5})
    assert isinstance(relative, SQLiteStoragePlugin)
    assert relative.path == tmp_path / "rel" / "c.sqlite"
    assert relative.timeout == 5.0
    with pytest.raises(ConfigError, match="nope"):
        url_to_storage_plugin("sqlite://x.sqlite", {"nope": 1})
    with pytest.raises(ConfigError):
        url_to_storage_plugin("sqlite://")


def test_model_and_optimizer_end_to_end(tmp_path: Path) -> None:
    """A module and an optimizer with state; the conformance suite's own end-to-end case uses a StateDict."""
    db = tmp_path / "run" / "step_1.sqlite"
    uri = f"sqlite://{db.as_posix()}"
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(uri).restore({"model": torch.nn.Linear(8, 4)})
    assert not db.exists()  # looking for a snapshot does not create the database

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    Snapshot.take(uri, {"model": model, "optim": optimizer})
    with pytest.raises(SnapshotExistsError):
        Snapshot.take(uri, {"model": model})

    assert ".snapshot_metadata" in _db_locations(str(db))  # the manifest is a row of the database

    fresh = torch.nn.Linear(8, 4)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    Snapshot(uri).restore({"model": fresh, "optim": fresh_optimizer})
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh.bias, model.bias)
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert torch.equal(Snapshot(uri).read_object("model/weight"), model.weight.detach())
