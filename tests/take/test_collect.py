"""``snapshotkit._take.collect``: values that cannot be stored are refused, and only what ``include=`` /
``exclude=`` select is described, before anything is written."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import Net, assert_nothing_committed

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ConfigError, InvalidArgumentError, UnsupportedValueError

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(lambda x: x, "function"), (threading.Lock(), "lock")],
    ids=["lambda", "lock"],
)
def test_unpicklable_value_raises_unsupported_value_and_writes_nothing(
    tmp_path: Path, value: Any, type_name: str
) -> None:
    path = tmp_path / "snap"
    app_state = {"model": Net(), "extras": StateDict(step=1, nested={"callback": value})}
    with pytest.raises(UnsupportedValueError) as info:
        Snapshot.take(str(path), app_state)
    exc = info.value
    assert isinstance(exc, TypeError)
    message = str(exc)
    assert "'extras/nested/callback'" in message
    assert type_name in message
    assert "picklable" in message
    assert not path.exists()
    assert_nothing_committed(path)


def test_meta_tensor_raises_unsupported_value_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    with pytest.raises(UnsupportedValueError) as info:
        Snapshot.take(str(path), {"extras": StateDict(w=torch.empty(3, device="meta"))})
    assert isinstance(info.value, TypeError)
    assert "'extras/w'" in str(info.value)
    assert "meta" in str(info.value)
    assert_nothing_committed(path)


# --------------------------------------------------------------------------------------------
# include= / exclude=: only the selected state is described, before anything is written


def _saved_paths(path: Path) -> set[str]:
    return {key.split("/", 1)[1] for key in Snapshot(str(path)).get_manifest()}


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        (None, None, {"model", "model/layer1.weight", "model/layer1.bias", "extras", "extras/step", "extras/nested"}),
        (["model/*weight"], None, {"model", "model/layer1.weight"}),
        (None, ["model/**"], {"extras", "extras/step", "extras/nested"}),
        (["model/**", "extras/step"], ["*bias"], {"model", "model/layer1.weight", "extras", "extras/step"}),
        (["*"], ["extras/nested", "model/layer1.*"], {"extras", "extras/step"}),
        (["extras/nested"], None, {"extras", "extras/nested"}),
    ],
    ids=["everything", "include", "exclude", "include-and-exclude", "exclude-wins", "empty-dict-leaf"],
)
@pytest.mark.parametrize("how", ["take", "async_take"])
def test_include_and_exclude_select_the_stored_leaves(
    tmp_path: Path, include: list[str] | None, exclude: list[str] | None, expected: set[str], how: str
) -> None:
    path = tmp_path / "snap"
    app_state = {"model": Net(), "extras": StateDict(step=1, nested={})}
    if how == "take":
        Snapshot.take(str(path), app_state, include=include, exclude=exclude)
    else:
        Snapshot.async_take(str(path), app_state, include=include, exclude=exclude).wait()
    assert _saved_paths(path) == expected


def test_leaves_left_out_are_never_serialized(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    app_state = {"extras": StateDict(step=1, callback=lambda x: x, lock=threading.Lock())}
    Snapshot.take(str(path), app_state, exclude=["extras/callback", "extras/lock"])
    assert _saved_paths(path) == {"extras", "extras/step"}


def test_a_list_that_lost_a_leaf_is_left_out_whole(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    app_state = {"extras": StateDict(groups=[{"lr": 0.1, "betas": [0.9, 0.99]}, {"lr": 0.2}], step=3)}
    Snapshot.take(str(path), app_state, exclude=["extras/groups/0/betas/1"])
    assert _saved_paths(path) == {"extras", "extras/step"}
    assert Snapshot(str(path)).read_object("extras") == {"step": 3}


@pytest.mark.parametrize(
    ("include", "exclude"),
    [([], None), (["optim/**"], None), (None, ["*"]), (["model/**"], ["model/**"])],
    ids=["empty-include", "no-match", "exclude-all", "exclude-what-is-included"],
)
@pytest.mark.parametrize("how", ["take", "async_take"])
def test_patterns_that_select_nothing_are_a_config_error_and_write_nothing(
    tmp_path: Path, include: list[str] | None, exclude: list[str] | None, how: str
) -> None:
    path = tmp_path / "snap"
    app_state = {"model": Net(), "extras": StateDict(step=1)}
    take = Snapshot.take if how == "take" else Snapshot.async_take
    with pytest.raises(ConfigError, match="select nothing") as info:
        take(str(path), app_state, include=include, exclude=exclude)
    assert "'model/layer1.weight'" in str(info.value)  # what there is to select
    assert isinstance(info.value, ValueError)
    assert not path.exists()


@pytest.mark.parametrize(
    ("include", "exclude"),
    [("model/**", None), (None, "model/**"), ([1], None), (None, [None]), (3, None)],
    ids=["include-str", "exclude-str", "include-int-pattern", "exclude-none-pattern", "include-int"],
)
@pytest.mark.parametrize("how", ["take", "async_take"])
def test_patterns_that_are_not_lists_of_str_are_refused_before_anything_is_written(
    tmp_path: Path, include: Any, exclude: Any, how: str
) -> None:
    path = tmp_path / "snap"
    take = Snapshot.take if how == "take" else Snapshot.async_take
    with pytest.raises(InvalidArgumentError, match="clude=") as info:
        take(str(path), {"model": Net()}, include=include, exclude=exclude)
    assert isinstance(info.value, TypeError)
    assert not path.exists()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
@pytest.mark.parametrize("how", ["take", "async_take"])
def test_a_nested_tensor_round_trips_as_an_object(layout: torch.layout, how: str, tmp_path: Path) -> None:
    # found by a review: a strided one raised torch's raw RuntimeError while being described, a
    # jagged one an AttributeError while the manifest was encoded
    def nested(*rows: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor(list(rows), layout=layout)

    value = nested(torch.ones(2, 1), torch.arange(3.0).reshape(3, 1))
    path = str(tmp_path / "snap")
    app_state = {"s": StateDict(x=value, y=torch.ones(2))}
    if how == "take":
        Snapshot.take(path, app_state)
    else:
        Snapshot.async_take(path, app_state).wait()
    snapshot = Snapshot(path)
    for state in (StateDict(), StateDict(x=nested(torch.zeros(2, 1), torch.zeros(3, 1)), y=torch.zeros(2))):
        snapshot.restore({"s": state})  # weights_only=True
        assert state["x"].is_nested and state["x"].layout == layout
        assert all(torch.equal(a, b) for a, b in zip(value.unbind(), state["x"].unbind(), strict=True))
    read = snapshot.read_object("s/x")
    assert all(torch.equal(a, b) for a, b in zip(value.unbind(), read.unbind(), strict=True))
