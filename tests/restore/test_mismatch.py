"""Restore and read_object (``snapshotkit._restore.plan`` and ``load``): what is asked for does not match
what is stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import Net, assert_not_quoted, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import LogicalPathNotFoundError, StateMismatchError

pytestmark = pytest.mark.usefixtures("clean_env")


def test_restore_unknown_key_lists_the_keys_the_snapshot_has(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).restore({"optimizer": StateDict()})
    exc = info.value
    assert isinstance(exc, KeyError)
    assert_not_quoted(exc)
    message = str(exc)
    assert "'optimizer'" in message
    assert "'model'" in message
    assert "'extras'" in message
    assert "Remove it from app_state" in message


def test_restore_misspelled_key_suggests_the_close_match(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).restore({"modle": Net()})
    assert "close matches: 'model'" in str(info.value)


def test_restore_unknown_key_loads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    model = Net()
    with torch.no_grad():
        model.layer1.weight.zero_()
    with pytest.raises(LogicalPathNotFoundError):
        Snapshot(str(path)).restore({"model": model, "optimizer": StateDict()})
    assert torch.count_nonzero(model.layer1.weight) == 0


@pytest.mark.parametrize(
    ("destination", "words"),
    [
        (torch.zeros(4), ["shape [8]", "shape [4]"]),
        (torch.zeros(8, dtype=torch.float64), ["dtype float32", "dtype float64"]),
        (torch.zeros(2, 4), ["shape [8]", "shape [2, 4]"]),
    ],
    ids=["shape", "dtype", "rank"],
)
def test_strict_restore_of_mismatched_tensor_raises_state_mismatch(
    tmp_path: Path, destination: torch.Tensor, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    extras = StateDict(step=0, w=destination, name="")
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"extras": extras})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    for word in words:
        assert word in message
    assert "strict=False" in message
    assert extras["w"] is destination
    assert torch.count_nonzero(destination) == 0


@pytest.mark.parametrize(
    "destination",
    [torch.zeros(4), torch.zeros(8, dtype=torch.float64)],
    ids=["shape", "dtype"],
)
def test_non_strict_restore_of_mismatched_tensor_loads_a_fresh_tensor(
    tmp_path: Path, destination: torch.Tensor
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    extras = StateDict(step=0, w=destination, name="")
    Snapshot(str(path)).restore({"extras": extras}, strict=False)
    restored = extras["w"]
    assert restored is not destination
    assert restored.dtype == torch.float32
    assert torch.equal(restored, torch.arange(8, dtype=torch.float32))
    assert torch.count_nonzero(destination) == 0
    assert extras["step"] == 3
    assert extras["name"] == "run"


class RenamedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(3, 2)


class WiderNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("extra", torch.zeros(1))


@pytest.mark.parametrize(
    ("module", "words"),
    [
        (RenamedNet(), ["'model/first.weight'", "'model/layer1.weight'"]),
        (WiderNet(), ["'model/extra'"]),
    ],
    ids=["renamed", "extra-buffer"],
)
def test_strict_restore_of_module_with_different_keys_raises_state_mismatch(
    tmp_path: Path, module: torch.nn.Module, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"model": module})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'model'" in message
    for word in words:
        assert word in message
    assert "strict=False" in message
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} was modified by a refused restore"


def test_non_strict_restore_of_module_with_extra_buffer_loads_the_common_keys(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    module = WiderNet()
    with torch.no_grad():
        module.layer1.weight.zero_()
    Snapshot(str(path)).restore({"model": module}, strict=False)
    assert torch.equal(module.layer1.weight, Net().layer1.weight)
    assert torch.equal(module.extra, torch.zeros(1))


def test_read_object_of_unknown_path_lists_close_matches(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).read_object("model/layer1.wieght")
    exc = info.value
    assert isinstance(exc, KeyError)
    assert_not_quoted(exc)
    message = str(exc)
    assert "'model/layer1.wieght'" in message
    assert "'model/layer1.weight'" in message
    assert "get_manifest()" in message


def test_read_object_of_unknown_rank_prefixed_path_raises_logical_path_not_found(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).read_object("7/model/layer1.weight")
    assert "'7/model/layer1.weight'" in str(info.value)


@pytest.mark.parametrize(
    ("obj_out", "words"),
    [
        (torch.empty(5), ["shape [2, 3]", "shape [5]"]),
        (torch.empty(2, 3, dtype=torch.float16), ["dtype float32", "dtype float16"]),
    ],
    ids=["shape", "dtype"],
)
def test_read_object_into_mismatched_obj_out_raises_state_mismatch(
    tmp_path: Path, obj_out: torch.Tensor, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).read_object("model/layer1.weight", obj_out=obj_out)
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'model/layer1.weight'" in message
    for word in words:
        assert word in message
