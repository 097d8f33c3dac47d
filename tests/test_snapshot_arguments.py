"""Careless arguments to the facade get a clear ``TypeError``/``ValueError`` before anything is
read or written (``~`` is expanded, as a shell would)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import Net, files_of, make_app_state, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ConfigError, InvalidAppStateError, InvalidArgumentError, StateMismatchError

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in an empty directory, with HOME pointing at another."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    return tmp_path


@pytest.mark.parametrize("path", [None, 7, b"snap", ["snap"]])
def test_a_path_that_is_not_a_str_is_a_type_error_and_writes_nothing(in_tmp: Path, path: Any) -> None:
    # Before: take(None) wrote the snapshot into ./None.
    for call in (
        lambda: Snapshot.take(path, {"s": StateDict(x=1)}),
        lambda: Snapshot.async_take(path, {"s": StateDict(x=1)}),
        lambda: Snapshot(path),
    ):
        with pytest.raises(InvalidArgumentError, match=r"must be a str or os\.PathLike") as info:
            call()
        assert isinstance(info.value, TypeError)
    assert files_of(in_tmp) == {}


@pytest.mark.parametrize("path", ["", "   ", "file://", "memory://"])
def test_an_empty_path_is_a_value_error_and_writes_nothing(in_tmp: Path, path: str) -> None:
    # Before: take("") wrote data/ and the manifest into the working directory.
    for call in (lambda: Snapshot.take(path, {"s": StateDict(x=1)}), lambda: Snapshot(path)):
        with pytest.raises(ConfigError, match="names no location") as info:
            call()
        assert isinstance(info.value, ValueError)
    assert files_of(in_tmp) == {}


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ([("step", 1)], InvalidArgumentError),
        ({"loss": float("nan")}, ConfigError),
        ({2: "two"}, ConfigError),
        ({"w": torch.ones(1)}, ConfigError),
        ({"big": "x" * (2 << 20)}, ConfigError),
    ],
    ids=["not-a-mapping", "nan", "int-key", "tensor", "too-large"],
)
def test_bad_metadata_is_refused_before_anything_is_written(in_tmp: Path, metadata: Any, error: type) -> None:
    for call in (
        lambda: Snapshot.take("snap", {"s": StateDict(x=torch.ones(3))}, metadata=metadata),
        lambda: Snapshot.async_take("snap", {"s": StateDict(x=torch.ones(3))}, metadata=metadata),
    ):
        with pytest.raises(error, match="metadata"):
            call()
    assert not (in_tmp / "work" / "snap").exists()
    assert files_of(in_tmp) == {}


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_tilde_is_the_home_directory(in_tmp: Path, prefix: str) -> None:
    # Before: "~/snap" was a directory named "~" in the working directory.
    snapshot = Snapshot.take(f"{prefix}~/snap", {"s": StateDict(x=1)})
    assert snapshot.path == f"{prefix}{in_tmp / 'home' / 'snap'}"
    assert (in_tmp / "home" / "snap" / ".snapshot_metadata").is_file()
    assert not (in_tmp / "work" / "~").exists()
    assert Snapshot(f"{prefix}~/snap").read_object("s/x") == 1
    assert Snapshot(Path("~") / "snap").read_object("s/x") == 1


@pytest.mark.parametrize("obj_out", [[1, 2], 3.0, {"w": 1}])
@pytest.mark.parametrize("logical_path", ["extras/w", "extras/step"])
def test_read_object_ignores_an_obj_out_that_is_not_a_tensor_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, obj_out: Any, logical_path: str
) -> None:
    # torchsnapshot ignores such an obj_out with a warning (its own test reads a primitive with
    # obj_out=777); before, this raised InvalidArgumentError and broke code written for it.
    take_basic(tmp_path / "snap")
    kept = repr(obj_out)
    with caplog.at_level(logging.WARNING, logger="snapshotkit.restore"):
        value = Snapshot(str(tmp_path / "snap")).read_object(logical_path, obj_out=obj_out)
    expected = make_app_state()["extras"][logical_path.split("/")[1]]
    if isinstance(expected, torch.Tensor):
        assert torch.equal(value, expected)
    else:
        assert value == expected
    assert repr(obj_out) == kept  # untouched
    [record] = [r for r in caplog.records if r.name == "snapshotkit.restore"]
    assert record.levelno == logging.WARNING
    assert f"obj_out is a {type(obj_out).__name__}, not a tensor" in record.getMessage()
    assert logical_path in record.getMessage()


def test_restore_checks_app_state_before_reading_the_snapshot(tmp_path: Path) -> None:
    # Before: the empty directory was reported (SnapshotNotFoundError), not the wrong argument.
    empty = tmp_path / "empty"
    empty.mkdir()
    for where in (empty, tmp_path / "absent"):
        with pytest.raises(InvalidAppStateError, match=r"app_state\['optim'\] is a int") as info:
            Snapshot(str(where)).restore({"optim": 1})  # type: ignore[dict-item]
        assert isinstance(info.value, TypeError)
        with pytest.raises(InvalidAppStateError, match="must be a dict"):
            Snapshot(str(where)).restore([1])  # type: ignore[arg-type]
    assert not (tmp_path / "absent").exists() and not any(empty.iterdir())


@pytest.mark.parametrize("how", ["take", "async_take"])
def test_take_checks_app_state_before_the_existing_snapshot_or_the_base(tmp_path: Path, how: str) -> None:
    take_basic(tmp_path / "snap")
    before = files_of(tmp_path / "snap")
    take = getattr(Snapshot, how)
    with pytest.raises(InvalidAppStateError, match=r"app_state\['optim'\]"):
        take(str(tmp_path / "snap"), {"optim": 1})  # an existing snapshot there
    with pytest.raises(InvalidAppStateError, match=r"app_state\['optim'\]"):
        take(str(tmp_path / "new"), {"optim": 1}, base=str(tmp_path / "no-base"))  # a base that is not there
    assert files_of(tmp_path / "snap") == before
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("logical_path", ["extras/step", "extras/history", "extras"])
def test_read_object_of_something_that_is_not_a_tensor_into_a_tensor_is_refused(
    tmp_path: Path, logical_path: str
) -> None:
    take_basic(tmp_path / "snap")
    with pytest.raises(StateMismatchError, match="not a tensor"):
        Snapshot(str(tmp_path / "snap")).read_object(logical_path, obj_out=torch.zeros(8))


def test_read_object_into_a_meta_tensor_is_refused(tmp_path: Path) -> None:
    take_basic(tmp_path / "snap")
    with pytest.raises(StateMismatchError, match="meta device"):
        Snapshot(str(tmp_path / "snap")).read_object("extras/w", obj_out=torch.empty(8, device="meta"))


@pytest.mark.parametrize("strict", [True, False])
def test_restore_into_a_module_on_the_meta_device_is_refused(tmp_path: Path, strict: bool) -> None:
    # Before: the restore returned and the module stayed on the meta device, with no data.
    take_basic(tmp_path / "snap")
    with torch.device("meta"):
        module = Net()
    with pytest.raises(StateMismatchError, match=r"'model/layer1\.(weight|bias)'.*meta device.*to_empty"):
        Snapshot(str(tmp_path / "snap")).restore({"model": module}, strict=strict)


class WideNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = torch.nn.Linear(4, 2)  # the snapshot's is Linear(3, 2)


def test_non_strict_restore_into_a_module_with_another_shape_is_refused_before_loading(tmp_path: Path) -> None:
    # Before: strict=False filled the matching bias in place, then load_state_dict() raised a raw
    # RuntimeError ("size mismatch") for the weight.
    take_basic(tmp_path / "snap")
    module = WideNet()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(StateMismatchError, match=r"'model/layer1\.weight'.*shape \[2, 3\].*\[2, 4\].*strict=False"):
        Snapshot(str(tmp_path / "snap")).restore({"model": module}, strict=False)
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} was modified by a refused restore"
    assert os.listdir(tmp_path) == ["snap"]
