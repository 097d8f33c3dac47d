"""``snapshotkit._take.prepare``: a take refuses a destination that already holds a snapshot or a file,
or a folder of ``step_<n>`` snapshots (a manager's root)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from _snapshots import files_of, make_app_state, take_basic

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit.errors import FolderOfSnapshotsError, SnapshotExistsError, SnapshotkitError
from snapshotkit.testing import FaultInjectingProxy

pytestmark = pytest.mark.usefixtures("clean_env")


def test_take_onto_existing_snapshot_raises_and_overwrites_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    other = {"extras": StateDict(w=torch.ones(1000), step=99)}

    with pytest.raises(SnapshotExistsError) as info:
        Snapshot.take(str(path), other)

    assert isinstance(info.value, FileExistsError)
    message = str(info.value)
    assert str(path) in message
    assert "never overwrites" in message
    assert "new path" in message
    assert files_of(path) == before


def test_take_onto_existing_snapshot_through_file_uri_raises(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    with pytest.raises(SnapshotExistsError):
        Snapshot.take(f"file://{path}", make_app_state())
    assert files_of(path) == before


def test_take_onto_regular_file_raises_snapshotkit_error_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a snapshot")
    with pytest.raises(SnapshotkitError) as info:
        take_basic(path)
    assert isinstance(info.value, OSError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b"not a snapshot"


# ---------------------------------------------------------------- a take into a folder of snapshots


def _manager_root(root: Path, steps: tuple[int, ...] = (1000, 2000, 3000, 4000)) -> None:
    with SnapshotManager(str(root), preemption_signals=(), async_executor=None) as mgr:
        for step in steps:
            mgr.save(step, make_app_state())


def test_take_into_a_manager_root_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    # Before: the take wrote .snapshot_metadata and data/ beside the step_<n> snapshots.
    root = tmp_path / "run7"
    _manager_root(root)
    before = files_of(root)
    takes = (Snapshot.take, Snapshot.async_take)
    for take, where in [(take, where) for take in takes for where in (f"file://{root}/", str(root))]:
        with pytest.raises(FolderOfSnapshotsError) as info:
            take(where, make_app_state())
        assert files_of(root) == before, (take, where)
    error = info.value
    assert isinstance(error, SnapshotExistsError) and isinstance(error, FileExistsError)
    assert error.steps == (1000, 2000, 3000, 4000)
    message = str(info.value)
    assert "is a folder of 4 snapshots (step_1000, step_2000, step_3000 and 1 more)" in message
    assert "Nothing was written" in message and "SnapshotManager's root" in message
    assert f"'{root}/step_<n>'" in message and f"'{root}/step_4000'" in message
    Snapshot.take(str(root / "step_5000"), make_app_state())  # the path meant


def test_a_folder_without_committed_step_snapshots_still_takes(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    (folder / "step_1" / "data").mkdir(parents=True)  # a take that never committed
    (folder / "step_1" / "data" / "0_00000_0123abcd").write_bytes(b"partial")
    (folder / "notes.txt").write_text("mine")
    take_basic(folder / "best")  # a snapshot, but not a step of a manager
    Snapshot.take(str(folder), make_app_state())
    assert Snapshot(str(folder)).metadata.world_size == 1


@pytest.mark.slow
def test_take_into_an_s3_root_is_refused_and_a_fresh_take_lists_once(seaweed_s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    bucket, prefix = "snapshotkit-folder-refusal", uuid.uuid4().hex
    client.create_bucket(Bucket=bucket)

    def keys() -> list[str]:
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))

    root = f"s3://{bucket}/{prefix}"
    with FaultInjectingProxy(seaweed_s3_endpoint) as proxy:
        options = {"endpoint_url": proxy.url}
        Snapshot.take(f"{root}/step_1", make_app_state(), storage_options=options)
        # what the check costs a take into a fresh path: one ListObjectsV2 (and the manifest's HEAD, as before)
        assert sum("list-type=2" in r.path for r in proxy.requests) == 1, proxy.requests
        before = keys()
        proxy.clear()
        with pytest.raises(FolderOfSnapshotsError, match=r"folder of 1 snapshot \(step_1\)"):
            Snapshot.take(root, make_app_state(), storage_options=options)
        assert [r for r in proxy.requests if r.method not in ("GET", "HEAD")] == []
    assert keys() == before
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in before]})
