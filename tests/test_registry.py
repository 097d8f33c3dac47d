"""URI -> plugin resolution: runtime registration, built-ins, entry points, unknown schemes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _snapshots import make_app_state

from snapshotkit import Snapshot, StateDict, errors
from snapshotkit.errors import StorageError, UnknownStorageSchemeError
from snapshotkit.storage import FSStoragePlugin, MemoryStoragePlugin, register_storage_plugin, url_to_storage_plugin
from snapshotkit.storage._registry import _registered, split_uri


def test_plain_paths_and_file_uris_are_the_filesystem(tmp_path: Path) -> None:
    assert split_uri(str(tmp_path)) == ("file", str(tmp_path))
    assert split_uri(f"file://{tmp_path}") == ("file", str(tmp_path))
    assert split_uri("S3://Bucket/x") == ("s3", "Bucket/x")
    assert isinstance(url_to_storage_plugin(str(tmp_path)), FSStoragePlugin)
    assert isinstance(url_to_storage_plugin(f"file://{tmp_path}"), FSStoragePlugin)
    assert isinstance(url_to_storage_plugin("memory://x"), MemoryStoragePlugin)


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(UnknownStorageSchemeError) as info:
        url_to_storage_plugin("nosuchscheme://bucket/x")
    assert isinstance(info.value, StorageError)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'nosuchscheme'" in message
    assert "file" in message
    assert "memory" in message
    assert "register_storage_plugin" in message


def test_runtime_registration_wins_and_is_used_end_to_end(tmp_path: Path) -> None:
    seen: list[str] = []

    def factory(root: str, options: dict[str, object]) -> FSStoragePlugin:
        seen.append(root)
        return FSStoragePlugin(root)

    register_storage_plugin("Mine", factory)
    try:
        Snapshot.take(f"mine://{tmp_path / 's'}", {"sd": StateDict(t=torch.arange(3))})
        assert torch.equal(Snapshot(f"mine://{tmp_path / 's'}").read_object("sd/t"), torch.arange(3))
    finally:
        _registered.pop("mine", None)
    assert seen
    assert all(root == str(tmp_path / "s") for root in seen)


@pytest.fixture
def entry_point_distribution(tmp_path: Path) -> Iterator[str]:
    """A real (if tiny) installed distribution declaring a plugin in the entry-point group."""
    site = tmp_path / "site"
    package = site / "skplugin_demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from snapshotkit.storage import FSStoragePlugin\n"
        "CREATED = []\n"
        "def factory(root, storage_options):\n"
        "    CREATED.append(root)\n"
        "    return FSStoragePlugin(root)\n"
    )
    info = site / "skplugin_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: skplugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[snapshotkit.storage_plugins]\ndemofs = skplugin_demo:factory\n")
    sys.path.insert(0, str(site))
    try:
        yield "demofs"
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("skplugin_demo", None)


def test_entry_point_plugins_are_discovered(tmp_path: Path, entry_point_distribution: str) -> None:
    uri = f"{entry_point_distribution}://{tmp_path / 'snap'}"
    Snapshot.take(uri, {"sd": StateDict(n=7)})
    assert Snapshot(uri).read_object("sd/n") == 7
    import skplugin_demo  # type: ignore[import-not-found]

    assert str(tmp_path / "snap") in skplugin_demo.CREATED
    with pytest.raises(UnknownStorageSchemeError, match="demofs"):
        url_to_storage_plugin("other://x")


@pytest.mark.usefixtures("clean_env")
def test_unknown_storage_scheme_raises_with_known_schemes(tmp_path: Path) -> None:
    with pytest.raises(errors.UnknownStorageSchemeError) as info:
        Snapshot.take("nosuchscheme://bucket/snap", make_app_state())
    exc = info.value
    assert isinstance(exc, ValueError)
    assert isinstance(exc, errors.StorageError)
    message = str(exc)
    assert "'nosuchscheme'" in message
    assert "file" in message
    assert "memory" in message
    assert "register_storage_plugin" in message
