"""snapshotkit.dcp on one process: dcp.save / async_save / load through SnapshotWriter and
SnapshotReader write and read real snapshots (verified, checksummed, committed last)."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner
from torch.distributed.checkpoint.api import CheckpointException

from snapshotkit import Snapshot
from snapshotkit.cli import main
from snapshotkit.dcp import SnapshotReader, SnapshotWriter
from snapshotkit.errors import (
    IncompleteSnapshotError,
    IntegrityError,
    InvalidArgumentError,
    SnapshotExistsError,
    SnapshotNotFoundError,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

TESTS = Path(__file__).resolve().parent.parent


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
    return model, optimizer


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "extra": {
            "step": 7,
            "name": "run-1",
            "config": {"lr": 0.01, "betas": (0.9, 0.99)},
            "big": bytes(range(256)) * 40,
        },
    }


def blank_like(state: dict[str, Any]) -> dict[str, Any]:
    """The same structure with every tensor zeroed and every other value replaced."""

    def blank(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.zeros_like(value)
        if isinstance(value, dict):
            return {k: blank(v) for k, v in value.items()}
        if isinstance(value, list):
            return [blank(v) for v in value]
        return None

    return blank(state)


def assert_equal(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype, where
        assert torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            assert_equal(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_equal(a, e, f"{where}/{i}")
    else:
        assert actual == expected and type(actual) is type(expected), where


def test_save_load_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model, optimizer = trained()
    state = state_of(model, optimizer)
    path = tmp_path / "step_1"
    dcp.save(state, storage_writer=SnapshotWriter(path), no_dist=True)

    loaded = blank_like(state)
    dcp.load(loaded, storage_reader=SnapshotReader(path), no_dist=True)
    assert_equal(loaded, state)


def test_logical_paths_are_those_of_snapshot_take(tmp_path: Path) -> None:
    model, _ = trained()
    dcp.save({"model": model.state_dict()}, storage_writer=SnapshotWriter(tmp_path / "dcp"), no_dist=True)
    Snapshot.take(str(tmp_path / "take"), {"model": model})
    via_dcp, via_take = Snapshot(str(tmp_path / "dcp")), Snapshot(str(tmp_path / "take"))
    assert sorted(via_dcp.get_manifest()) == sorted(via_take.get_manifest())
    weight = via_dcp.read_object("model/0.weight")
    assert torch.equal(weight, model.state_dict()["0.weight"])
    # and a snapshot from Snapshot.take loads through DCP
    loaded = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp.load(loaded, storage_reader=SnapshotReader(tmp_path / "take"), no_dist=True)
    assert_equal(loaded["model"], model.state_dict())


def test_non_tensor_values_read_back_as_values(tmp_path: Path) -> None:
    model, optimizer = trained()
    state = state_of(model, optimizer)
    dcp.save(state, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True)
    snapshot = Snapshot(str(tmp_path / "s"))
    assert snapshot.read_object("extra/step") == 7
    assert snapshot.read_object("extra/config/betas") == (0.9, 0.99)
    assert snapshot.read_object("extra/big") == state["extra"]["big"]
    assert snapshot.read_object("optim/param_groups/0/lr") == 0.01


def test_verify_and_info_work_on_a_dcp_save(tmp_path: Path) -> None:
    model, optimizer = trained()
    path = str(tmp_path / "s")
    dcp.save(state_of(model, optimizer), storage_writer=SnapshotWriter(path), no_dist=True)
    runner = CliRunner()
    verified = runner.invoke(main, ["verify", path], catch_exceptions=False, env={"COLUMNS": "160"})
    assert verified.exit_code == 0, verified.output
    info = runner.invoke(main, ["info", path], catch_exceptions=False, env={"COLUMNS": "160"})
    assert info.exit_code == 0 and "model/0.weight" in info.output, info.output


def test_a_flipped_byte_fails_the_load_with_our_error(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    path = tmp_path / "s"
    dcp.save({"model": model.state_dict()}, storage_writer=SnapshotWriter(path), no_dist=True)
    entry = Snapshot(str(path)).get_manifest()["0/model/weight"]
    piece = entry.pieces[0]
    data_file = path / piece.location
    raw = bytearray(data_file.read_bytes())
    raw[piece.byte_range[0] + 100] ^= 0xFF
    data_file.write_bytes(bytes(raw))

    loaded = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    with pytest.raises(CheckpointException) as caught:
        dcp.load(loaded, storage_reader=SnapshotReader(path), no_dist=True)
    errors = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(e, IntegrityError) and "model/weight" in str(e) for e in errors), errors
    assert "checksum mismatch for logical path 'model/weight'" in str(caught.value)  # what the user sees


def test_async_save_in_a_thread_round_trips(tmp_path: Path) -> None:
    model, optimizer = trained()
    state = state_of(model, optimizer)
    expected = {k: v.clone() for k, v in state["model"].items()}
    future = dcp.async_save(state, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True)
    with torch.no_grad():  # the caller may change its tensors once async_save returned
        for tensor in model.parameters():
            tensor.add_(1.0)
    future.result()
    loaded = {"model": {k: torch.zeros_like(v) for k, v in expected.items()}}
    dcp.load(loaded, storage_reader=SnapshotReader(tmp_path / "s"), no_dist=True)
    assert_equal(loaded["model"], expected)


def test_the_writer_is_async_save_s_stager_and_its_cache_is_reused_unpinned_on_cpu(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.staging import AsyncStager

    model, optimizer = trained()
    state = state_of(model, optimizer)
    writer = SnapshotWriter(tmp_path / "unused", cache_staged_state_dict=True)
    assert isinstance(writer, AsyncStager)
    first = writer.stage(state)
    second = writer.stage(state)
    weight = first["model"]["0.weight"]
    assert second["model"]["0.weight"] is weight and weight is not state["model"]["0.weight"]
    assert not weight.is_pinned()  # nothing is pinned for a CPU state (DCP's own cache pins always)
    assert pickle.loads(pickle.dumps(writer)).state_dict_cache is None  # the cache stays in this process
    expected = {k: v.clone() for k, v in state["model"].items()}
    for step in (1, 2):  # the second save stages into the first one's tensors
        future = dcp.async_save(state, storage_writer=writer, checkpoint_id=tmp_path / f"step_{step}", no_dist=True)
        with torch.no_grad():  # changes after async_save returned are not in the snapshot
            for tensor in model.parameters():
                tensor.add_(1.0)
        future.result()
        loaded = {"model": {k: torch.zeros_like(v) for k, v in expected.items()}}
        dcp.load(loaded, storage_reader=SnapshotReader(tmp_path / f"step_{step}"), no_dist=True)
        assert_equal(loaded["model"], expected)
        expected = {k: v + 1.0 for k, v in expected.items()}
    with pytest.raises(InvalidArgumentError, match="cache_staged_state_dict"):
        SnapshotWriter(tmp_path / "x", cache_staged_state_dict="yes")  # type: ignore[arg-type]


def test_writer_and_reader_pickle_and_take_checkpoint_ids(tmp_path: Path) -> None:
    writer = pickle.loads(pickle.dumps(SnapshotWriter(tmp_path / "a", storage_options={"k": 1}, base=tmp_path / "b")))
    assert (
        writer.path == str(tmp_path / "a") and writer.storage_options == {"k": 1} and writer.base == str(tmp_path / "b")
    )
    assert SnapshotWriter.validate_checkpoint_id(tmp_path / "x") and SnapshotWriter.validate_checkpoint_id("s3://b/p")
    assert not SnapshotWriter.validate_checkpoint_id(None) and not SnapshotReader.validate_checkpoint_id("")
    assert not SnapshotReader.validate_checkpoint_id("nosuchscheme://b/p")

    state = {"w": torch.arange(10.0)}
    dcp.save(state, checkpoint_id=tmp_path / "by_id", storage_writer=SnapshotWriter(tmp_path / "unused"), no_dist=True)
    assert not (tmp_path / "unused").exists()
    loaded = {"w": torch.zeros(10)}
    reader = pickle.loads(pickle.dumps(SnapshotReader(tmp_path / "elsewhere")))
    dcp.load(loaded, checkpoint_id=str(tmp_path / "by_id"), storage_reader=reader, no_dist=True)
    assert torch.equal(loaded["w"], state["w"])


def test_a_save_never_overwrites_a_snapshot(tmp_path: Path) -> None:
    dcp.save({"w": torch.ones(3)}, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True)
    with pytest.raises(CheckpointException) as caught:
        dcp.save({"w": torch.zeros(3)}, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True)
    assert any(isinstance(exc, SnapshotExistsError) for exc, _ in caught.value.failures.values())
    assert torch.equal(Snapshot(str(tmp_path / "s")).read_object("w"), torch.ones(3))


def test_a_failed_save_leaves_nothing(tmp_path: Path) -> None:
    sys.path.insert(0, str(TESTS))
    import _storage_doubles

    _storage_doubles.register()
    path = tmp_path / "s"
    with pytest.raises(CheckpointException) as caught:
        dcp.save({"w": torch.ones(1000)}, storage_writer=SnapshotWriter(f"failing://{path}"), no_dist=True)
    assert "No space left on device" in str(caught.value)
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).metadata
    assert not path.exists() or not any(p.is_file() for p in path.rglob("*"))


_KILLED_SAVE = """
import sys
sys.path.insert(0, {tests!r})
import _storage_doubles
import torch
import torch.distributed.checkpoint as dcp
from snapshotkit.dcp import SnapshotWriter

_storage_doubles.register()
state = {{"w": {{f"t{{i}}": torch.full((4096,), float(i)) for i in range(8)}}}}
dcp.save(state, storage_writer=SnapshotWriter("slow://{path}"), no_dist=True)
print("saved", flush=True)
"""


def test_a_save_killed_while_writing_leaves_nothing_that_opens(tmp_path: Path) -> None:
    path = tmp_path / "step_1"
    script = _KILLED_SAVE.format(tests=str(TESTS), path=str(path))
    env = {
        "SNAPSHOTKIT_DATA_OBJECT_BYTES": "16384",
        "SNAPSHOTKIT_CHUNK_BYTES": "16384",
        "SNAPSHOTKIT_TEST_WRITE_DELAY": "0.5",
        "PYTHONPATH": str(TESTS.parent),
    }
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env={**os.environ, **env})
    log = tmp_path / "step_1.writes"
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().strip()):  # the first data object is written
            assert child.poll() is None and time.monotonic() < deadline, "the save ended before it was killed"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert any(p.is_file() for p in (path / "data").rglob("*"))  # it did write
    with pytest.raises(IncompleteSnapshotError):
        Snapshot(str(path)).metadata
    with pytest.raises(CheckpointException):
        dcp.load({"w": {"t0": torch.zeros(4096)}}, storage_reader=SnapshotReader(path), no_dist=True)
    cleanup = CliRunner().invoke(main, ["cleanup", str(tmp_path)], catch_exceptions=False)
    assert cleanup.exit_code == 0, cleanup.output
    assert not path.exists()


def test_incremental_save_writes_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", str(1 << 16))
    monkeypatch.setenv("SNAPSHOTKIT_MIN_REFERENCE_BYTES", str(1 << 16))
    state = {"model": {f"w{i}": torch.randn(1 << 14) for i in range(20)}}  # 20 tensors of 64 KiB
    full = SnapshotWriter(tmp_path / "step_1")
    dcp.save(state, storage_writer=full, no_dist=True)
    for i in range(2):  # 10% changed
        state["model"][f"w{i}"].add_(1.0)
    incremental = SnapshotWriter(tmp_path / "step_2", base=tmp_path / "step_1")
    dcp.save(state, storage_writer=incremental, no_dist=True)

    assert full.written_bytes == 20 * (1 << 16)
    assert incremental.written_bytes == 2 * (1 << 16)
    snapshot = Snapshot(str(tmp_path / "step_2"))
    assert set(snapshot.metadata.bases) == {"../step_1"}
    loaded = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    dcp.load(loaded, storage_reader=SnapshotReader(tmp_path / "step_2"), no_dist=True)
    assert_equal(loaded, state)


@pytest.fixture
def s3_root(seaweed_s3_endpoint: str) -> Iterator[tuple[str, dict[str, str]]]:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket="snapshotkit-dcp")
    prefix = uuid.uuid4().hex
    yield f"s3://snapshotkit-dcp/{prefix}", {"endpoint_url": seaweed_s3_endpoint}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="snapshotkit-dcp", Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            client.delete_object(Bucket="snapshotkit-dcp", Key=item["Key"])


@pytest.mark.slow
def test_s3_round_trip(s3_root: tuple[str, dict[str, str]]) -> None:
    root, options = s3_root
    model, optimizer = trained()
    state = state_of(model, optimizer)
    dcp.save(state, storage_writer=SnapshotWriter(f"{root}/step_1", storage_options=options), no_dist=True)
    loaded = blank_like(state)
    dcp.load(loaded, storage_reader=SnapshotReader(f"{root}/step_1", storage_options=options), no_dist=True)
    assert_equal(loaded, state)
    assert Snapshot(f"{root}/step_1", storage_options=options).read_object("extra/step") == 7


def test_bytes_items_load_exactly_as_dcp_saved_them(tmp_path: Path) -> None:
    value = {"nested": [1, 2.5, "x"], "t": torch.arange(3)}
    dcp.save({"obj": value}, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True)
    stored = Snapshot(str(tmp_path / "s")).read_object("obj/nested")
    assert stored == [1, 2.5, "x"]
    loaded: dict[str, Any] = {"obj": {"nested": None, "t": torch.zeros(3, dtype=torch.int64)}}
    dcp.load(loaded, storage_reader=SnapshotReader(tmp_path / "s"), no_dist=True)
    assert loaded["obj"]["nested"] == [1, 2.5, "x"] and torch.equal(loaded["obj"]["t"], torch.arange(3))


def test_use_collectives_false_on_one_process_saves(tmp_path: Path) -> None:
    dcp.save(
        {"w": torch.arange(4.0)}, storage_writer=SnapshotWriter(tmp_path / "s"), no_dist=True, use_collectives=False
    )
    assert torch.equal(Snapshot(str(tmp_path / "s")).read_object("w"), torch.arange(4.0))
