"""A take replacing the snapshot at its path (``_replace=True``, what ``SnapshotCheckpointIO`` saves
with): the new snapshot restores bit-exact, the old data objects are gone, nothing else is left,
on a file system, ``memory://`` and ``s3://`` (SeaweedFS), for ``take`` and both ``async_take``
executors; leftovers of a replace cut short after its commit do not make the snapshot damaged,
and the next replace deletes them; a replace refuses its own path as ``base=``.

Before: a take onto a path holding a snapshot raised ``SnapshotExistsError``, and
``SnapshotCheckpointIO`` deleted the old snapshot before taking the new one.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.entries import pieces_of
from snapshotkit._runtime.loop import run_sync
from snapshotkit.cli import main
from snapshotkit.errors import ConfigError, FolderOfSnapshotsError, SnapshotExistsError
from snapshotkit.storage import StoragePlugin, url_to_storage_plugin
from snapshotkit.storage._memory import _STORE
from snapshotkit.verify import verify_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _storage_doubles
from _snapshots import data_objects, files_of

pytestmark = pytest.mark.usefixtures("clean_env")

MANIFEST = ".snapshot_metadata"
MODES = ["sync", "thread", "process"]


def state(step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": StateDict(w=torch.randn(300, 70, generator=generator), b=torch.arange(50) * step, step=step),
        "extra": StateDict(note=f"step {step}"),
    }


def blank() -> dict[str, Any]:
    return {"model": StateDict(w=torch.zeros(300, 70), b=torch.zeros(50, dtype=torch.long), step=-1),
            "extra": StateDict(note="")}  # fmt: skip


def assert_restores(path: str, step: int, storage_options: dict[str, Any] | None = None) -> None:
    restored = blank()
    Snapshot(path, storage_options=storage_options).restore(restored)
    expected = state(step)
    assert torch.equal(restored["model"]["w"], expected["model"]["w"])
    assert torch.equal(restored["model"]["b"], expected["model"]["b"])
    assert restored["model"]["step"] == step and restored["extra"]["note"] == f"step {step}"
    assert verify_snapshot(path, storage_options=storage_options).ok


def take(path: str, step: int, mode: str = "sync", **kwargs: Any) -> None:
    if mode == "sync":
        Snapshot.take(path, state(step), **kwargs)
    else:
        Snapshot.async_take(path, state(step), executor=mode, **kwargs).wait()


def referenced(path: str, storage_options: dict[str, Any] | None = None) -> set[str]:
    """The data objects of its own that the snapshot at ``path`` references."""
    manifest = Snapshot(path, storage_options=storage_options).metadata.manifest
    return {piece.location for entry in manifest.values() for piece in pieces_of(entry) if piece.base is None}


@pytest.mark.parametrize("mode", MODES)
def test_a_replace_on_a_file_system_leaves_the_new_snapshot_and_nothing_else(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(32 * 1024))  # several data objects
    path = str(tmp_path / "last.ckpt")
    take(path, 1)
    old = set(data_objects(Path(path)))
    assert len(old) > 1
    take(path, 2, mode, _replace=True)
    assert_restores(path, 2)
    new = set(data_objects(Path(path)))
    assert new and not new & old  # the old data objects are gone
    assert set(files_of(Path(path))) == {MANIFEST, *new}
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
    take(path, 3, mode, _replace=True)  # and again
    assert_restores(path, 3)
    assert not set(data_objects(Path(path))) & (old | new)


def test_without_replace_a_take_still_refuses_an_existing_snapshot(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    take(path, 1)
    with pytest.raises(SnapshotExistsError):
        take(path, 2)
    assert_restores(path, 1)


def test_a_replace_onto_a_fresh_path_or_leftovers_takes_it(tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh")
    take(fresh, 1, _replace=True)
    assert_restores(fresh, 1)
    # The leftovers of a take that never committed: replaced too, and deleted once committed.
    leftover = tmp_path / "left" / "data" / "0_00000_0badc0de"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x" * 100)
    take(str(tmp_path / "left"), 2, _replace=True)
    assert_restores(str(tmp_path / "left"), 2)
    assert not leftover.exists()


def _store(prefix: str) -> dict[str, bytes]:
    return {key.removeprefix(prefix): value for key, value in list(_STORE.items()) if key.startswith(prefix)}


def test_a_replace_on_a_memory_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(32 * 1024))
    path = "memory://replace-test/last.ckpt"
    try:
        take(path, 1)
        old = {k for k in _store("replace-test/last.ckpt/") if k.startswith("data/")}
        take(path, 2, "thread", _replace=True)
        assert_restores(path, 2)
        left = _store("replace-test/last.ckpt/")
        new = {k for k in left if k.startswith("data/")}
        assert new and not new & old
        assert set(left) == {MANIFEST, *new}
    finally:
        for key in list(_STORE):
            if key.startswith("replace-test/"):
                del _STORE[key]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "process"])
def test_a_replace_on_s3(seaweed_s3_endpoint: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(32 * 1024))
    bucket = f"replace-{mode}"
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    client.create_bucket(Bucket=bucket)
    options = {"endpoint_url": seaweed_s3_endpoint}
    path = f"s3://{bucket}/run/last.ckpt"

    def keys() -> set[str]:
        return {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}

    take(path, 1, storage_options=options)
    old = keys()
    take(path, 2, mode, storage_options=options, _replace=True)
    assert_restores(path, 2, options)
    new = keys()
    assert f"run/last.ckpt/{MANIFEST}" in new
    assert not (new - {f"run/last.ckpt/{MANIFEST}"}) & old  # the old data objects are gone
    assert {k.removeprefix("run/last.ckpt/") for k in new} == {MANIFEST, *referenced(path, options)}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
def test_a_replace_on_gcs(fake_gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import urllib.request

    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(32 * 1024))
    bucket = "replace-test"
    request = urllib.request.Request(
        f"{fake_gcs_endpoint}/storage/v1/b?project=test",
        json.dumps({"name": bucket}).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=60).close()
    options = {"project": "test", "token": "anon", "endpoint_url": fake_gcs_endpoint}
    path = f"gs://{bucket}/run/last.ckpt"

    def objects() -> set[str]:
        plugin = url_to_storage_plugin(path, options)

        async def listing() -> list[str]:
            try:
                return await plugin.list("")
            finally:
                await plugin.close()

        return set(run_sync(listing()))

    take(path, 1, storage_options=options)
    old = objects()
    take(path, 2, storage_options=options, _replace=True)
    assert_restores(path, 2, options)
    assert objects() == {MANIFEST, *referenced(path, options)}
    assert not (objects() - {MANIFEST}) & old


def test_leftovers_of_a_replace_cut_after_its_commit_are_harmless_and_the_next_replace_deletes_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "last.ckpt"
    take(str(path), 1)
    kept = tmp_path / "kept"
    shutil.copytree(path / "data", kept)
    take(str(path), 2, _replace=True)
    for name in os.listdir(kept):  # as if the replace was killed before deleting the old data
        shutil.copy(kept / name, path / "data" / name)
    shutil.rmtree(kept)
    stale = set(os.listdir(path / "data")) - {loc.removeprefix("data/") for loc in referenced(str(path))}
    assert stale

    assert_restores(str(path), 2)  # verify finds nothing wrong
    runner = CliRunner()
    for command in (["verify", str(path)], ["info", str(path)], ["ls", str(tmp_path)], ["cleanup", str(tmp_path)]):
        result = runner.invoke(main, command, catch_exceptions=False, env={"COLUMNS": "160"})
        assert result.exit_code == 0, (command, result.output)
        assert "damaged" not in result.output, result.output
    assert "0 incomplete snapshots removed" in result.output
    assert stale <= set(os.listdir(path / "data"))  # cleanup leaves a committed snapshot alone
    take(str(path), 3, _replace=True)
    assert_restores(str(path), 3)
    assert set(files_of(path)) == {MANIFEST, *referenced(str(path))}


def test_a_replace_refuses_its_own_path_as_base_before_writing(tmp_path: Path) -> None:
    path = str(tmp_path / "last.ckpt")
    take(path, 1)
    before = files_of(Path(path))
    for base in (path, Snapshot(path), path + "/"):
        with pytest.raises(ConfigError, match="base="):
            take(path, 2, base=base, _replace=True)
        assert files_of(Path(path)) == before
    # Another base in the folder is fine: the replace keeps the base's pieces referenced.
    take(str(tmp_path / "base"), 2)
    take(path, 2, base=str(tmp_path / "base"), _replace=True)
    assert_restores(path, 2)
    assert Snapshot(path).metadata.bases


def test_a_replace_still_refuses_a_folder_of_snapshots(tmp_path: Path) -> None:
    take(str(tmp_path / "root" / "step_1"), 1)
    with pytest.raises(FolderOfSnapshotsError):
        take(str(tmp_path / "root"), 2, _replace=True)
    assert sorted(os.listdir(tmp_path / "root")) == ["step_1"]


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_the_plugins_replace_an_object_whole(tmp_path: Path, scheme: str) -> None:
    plugin: StoragePlugin = url_to_storage_plugin(f"{scheme}://{tmp_path}/objects")
    assert plugin.capabilities.atomic_replace

    async def run() -> tuple[bytes, list[str]]:
        await plugin.write("m", b"old")
        await plugin.replace("m", [b"ne", b"w"])
        return bytes(await plugin.read("m")), await plugin.list("")

    async def clean() -> None:
        await plugin.delete("m")
        await plugin.close()

    try:
        assert run_sync(run()) == (b"new", ["m"])  # no temporary file left
    finally:
        run_sync(clean())


def test_a_replace_deletes_the_temporary_file_of_a_killed_manifest_write(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    take(str(path), 1)
    (path / f"{MANIFEST}.tmp-0123abcd").write_bytes(b"{")  # a manifest write killed before its rename
    assert_restores(str(path), 1)
    take(str(path), 2, _replace=True)
    assert set(files_of(path)) == {MANIFEST, *referenced(str(path))}


def test_the_later_of_two_overlapping_replaces_is_refused_and_deletes_only_its_own_data(tmp_path: Path) -> None:
    """A replacing async_take whose writes are held while another replace of the same path
    commits (and deletes the objects it listed) must not commit over it: its manifest would
    reference objects that may be gone. It raises, and the path holds the other one, whole."""
    _storage_doubles.register()
    path = tmp_path / "last.ckpt"
    take(str(path), 1)
    with _storage_doubles.Gate(tmp_path / "gate") as gate:
        pending = Snapshot.async_take(
            f"gated://{path}", state(2), executor="thread", storage_options={"gate": gate.path}, _replace=True
        )
        take(str(path), 3, _replace=True)  # commits while the first one's writes wait at the gate
        gate.open()
        with pytest.raises(SnapshotExistsError, match="must not overlap"):
            pending.wait(60)
    assert_restores(str(path), 3)
    assert set(files_of(path)) == {MANIFEST, *referenced(str(path))}
