"""The local filesystem plugin: the storage conformance suite, objects that are not files in the
snapshot (symlinks out of it, FIFOs, sockets), durability order and commit leftovers."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from _snapshots import MANIFEST, assert_nothing_committed, data_objects, make_app_state, piece_of, take_basic

from snapshotkit import Snapshot
from snapshotkit.errors import IntegrityError, SnapshotkitError, StorageError, UnsafeStorageObjectError
from snapshotkit.storage import ByteRange, FSStoragePlugin, StoragePlugin
from snapshotkit.testing import StoragePluginConformance

T = TypeVar("T")


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


# ---------------------------------------------------------------------- objects that are not files


def _call_or_unblock(function: Callable[[], T], fifo: Path | None = None, timeout_s: float = 20.0) -> T:
    """``function()``, failing the test (instead of hanging it) if it blocks: a blocked open of
    ``fifo`` is released by opening the FIFO's other end."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader is waiting: this succeeds
            thread.join(timeout_s)
        pytest.fail(f"blocked for {timeout_s} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def _read_all_ways(plugin: FSStoragePlugin, location: str) -> list[Callable[[], Any]]:
    return [
        lambda: asyncio.run(plugin.read(location)),
        lambda: asyncio.run(plugin.read(location, ByteRange(0, 1))),
        lambda: asyncio.run(plugin.read_into(location, 0, [memoryview(bytearray(1))])),
    ]


def test_symlink_leading_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"bytes outside the snapshot")
    (root / "data" / "obj").symlink_to(secret)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "obj").write_bytes(b"more bytes outside")
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    plugin = FSStoragePlugin(root)
    for location in ("data/obj", "linked/obj", "../secret.bin"):
        for read in _read_all_ways(plugin, location):
            with pytest.raises(UnsafeStorageObjectError, match="outside the snapshot root") as info:
                read()
            assert location.rsplit("/", 1)[-1] in str(info.value)
            assert isinstance(info.value, StorageError)
    # listing does not descend into a linked directory
    assert asyncio.run(plugin.list()) == ["data/obj"]


def test_symlink_inside_the_root_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "real").write_bytes(b"abc")
    (root / "data" / "alias").symlink_to("real")
    assert bytes(asyncio.run(FSStoragePlugin(root).read("data/alias"))) == b"abc"


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    fifo = root / "data" / "obj"
    os.mkfifo(fifo)
    plugin = FSStoragePlugin(root)
    for read in _read_all_ways(plugin, "data/obj"):
        with pytest.raises(UnsafeStorageObjectError, match=r"data/obj.*is a FIFO, not a regular file"):
            _call_or_unblock(read, fifo)


def test_socket_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    path = root / "sock"
    if len(str(path)) >= 100:
        pytest.skip("the temporary path is too long for a unix socket")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(UnsafeStorageObjectError, match=r"sock.*not a regular file"):
            _call_or_unblock(lambda: asyncio.run(FSStoragePlugin(root).read("sock")))


def _replace_data_object(snapshot: Path, how: str, tmp_path: Path) -> Path:
    """Swap the data object holding ``model/layer1.weight`` for a symlink out of the root or a FIFO."""
    data_object, _, _ = piece_of(snapshot, "model/layer1.weight")
    if how == "symlink":
        outside = tmp_path / "moved-out"
        data_object.rename(outside)  # the very bytes: checksums would pass
        data_object.symlink_to(outside)
    else:
        data_object.unlink()
        os.mkfifo(data_object)
    return data_object


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_restore_refuses_a_data_object_that_is_not_a_file_in_the_snapshot(tmp_path: Path, how: str) -> None:
    """Issue 13, item 3: the symlink was followed out of the root; the FIFO hung restore forever."""
    snapshot = tmp_path / "snap"
    take_basic(snapshot)
    data_object = _replace_data_object(snapshot, how, tmp_path)
    location = data_object.relative_to(snapshot).as_posix()
    for read in (
        lambda: Snapshot(str(snapshot)).restore(make_app_state()),
        lambda: Snapshot(str(snapshot)).read_object("model/layer1.weight"),
    ):
        with pytest.raises(IntegrityError) as info:
            _call_or_unblock(read, data_object if how == "fifo" else None)
        message = str(info.value)
        assert "'model/layer1.weight'" in message and location in message
        assert "restore from another snapshot" in message
        assert isinstance(info.value.__cause__, UnsafeStorageObjectError)


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_a_manifest_that_is_not_a_file_in_the_snapshot_is_refused(tmp_path: Path, how: str) -> None:
    snapshot = tmp_path / "snap"
    take_basic(snapshot)
    manifest = snapshot / MANIFEST
    if how == "symlink":
        manifest.rename(tmp_path / "outside-manifest")
        manifest.symlink_to(tmp_path / "outside-manifest")
    else:
        manifest.unlink()
        os.mkfifo(manifest)
    with pytest.raises(UnsafeStorageObjectError, match=r"\.snapshot_metadata") as info:
        _call_or_unblock(lambda: Snapshot(str(snapshot)).metadata, manifest if how == "fifo" else None)
    assert isinstance(info.value, SnapshotkitError)


# ---------------------------------------------------------------------- durability and leftovers


@pytest.fixture
def sync_log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync/fdatasync (``("sync", path)``) and hard link (``("link", target)``), in order."""
    log: list[tuple[str, str]] = []
    real_fsync, real_fdatasync, real_link = os.fsync, os.fdatasync, os.link

    def recorded(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            log.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        return sync

    def link(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        real_link(source, target, *args, **kwargs)
        log.append(("link", os.fspath(target)))

    monkeypatch.setattr(os, "fsync", recorded(real_fsync))
    monkeypatch.setattr(os, "fdatasync", recorded(real_fdatasync))
    monkeypatch.setattr(os, "link", link)
    return log


def test_everything_the_manifest_points_at_is_synced_before_it_is_linked(
    tmp_path: Path, sync_log: list[tuple[str, str]]
) -> None:
    """Issue 13, item 10: the data/ directory and the parent that gained the snapshot were never synced."""
    parent = tmp_path / "runs"
    parent.mkdir()
    snapshot = parent / "step_1"
    take_basic(snapshot)
    link_at = sync_log.index(("link", str(snapshot / MANIFEST)))
    before = [path for op, path in sync_log[:link_at] if op == "sync"]
    after = [path for op, path in sync_log[link_at + 1 :] if op == "sync"]
    data_files = [str(snapshot / name) for name in data_objects(snapshot)]
    assert data_files
    for data_file in data_files:
        synced_at = before.index(data_file)
        # the directory holding its entry is synced after the file was written
        assert str(snapshot / "data") in before[synced_at + 1 :], data_file
    # each directory that gained an entry: parent gained step_1, step_1 gained data/
    assert str(parent) in before
    assert str(snapshot) in before
    assert before.index(str(parent)) < before.index(str(snapshot))  # shallowest first
    # the manifest's own bytes before the link, its directory after
    assert any(Path(p).name.startswith(f"{MANIFEST}.tmp-") for p in before)
    assert after == [str(snapshot)]


def test_a_failed_commit_leaves_no_temporary_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13, item 8: ENOSPC while writing the manifest left ``.snapshot_metadata.tmp-*`` behind,
    and the path then reported an incomplete snapshot instead of none."""
    real_writev = os.writev

    def writev(fd: int, buffers: Any) -> int:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(f"{MANIFEST}.tmp-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    snapshot = tmp_path / "snap"
    with pytest.raises(SnapshotkitError, match="No space left on device") as info:
        take_basic(snapshot)
    monkeypatch.undo()
    leftovers = [p.name for p in snapshot.rglob("*") if p.is_file()] if snapshot.exists() else []
    assert leftovers == []
    assert_nothing_committed(snapshot)
    assert isinstance(info.value, StorageError)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert ".snapshot_metadata.tmp-" in str(info.value)  # the file that could not be written


def _directory_fsync_failing_with(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_an_io_error_from_a_directory_fsync_fails_the_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, item 7: EIO from fsync on a directory was ignored, so a take whose entries may not
    survive a crash succeeded."""
    _directory_fsync_failing_with(monkeypatch, errno.EIO)
    snapshot = tmp_path / "snap"
    with pytest.raises(StorageError) as info:
        take_basic(snapshot)
    monkeypatch.undo()
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EIO
    assert "data/" in str(info.value)  # the data object whose entry could not be made durable
    assert_nothing_committed(snapshot)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP])
def test_a_file_system_that_cannot_fsync_directories_still_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    _directory_fsync_failing_with(monkeypatch, code)
    snapshot = tmp_path / "snap"
    take_basic(snapshot)
    monkeypatch.undo()
    assert Snapshot(str(snapshot)).read_object("extras/step") == 3


def test_a_plugin_writes_again_into_a_directory_deleted_since_it_made_it(tmp_path: Path) -> None:
    """The checkpoint daemon keeps its plugins across takes: a snapshot deleted and taken again at
    the same path (Lightning's ``last.ckpt``) finds the directories it made before gone."""
    plugin = FSStoragePlugin(tmp_path / "last.ckpt")

    async def scenario() -> bytes:
        await plugin.write("data/0_00000_aa", b"first")
        await plugin.delete_prefix("")
        await plugin.remove_empty_dirs("data/")
        assert not (tmp_path / "last.ckpt" / "data").exists()
        await plugin.write("data/0_00000_bb", b"second")
        data = bytes(await plugin.read("data/0_00000_bb"))
        await plugin.close()
        return data

    assert asyncio.run(scenario()) == b"second"
