"""``snapshotkit._app_state``: an ``app_state`` that is not a dict of name -> Stateful is refused up front."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import Net, files_of, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import InvalidAppStateError

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(torch.zeros(2), "Tensor"), (3, "int"), ("text", "str"), ({"a": 1}, "dict")],
    ids=["tensor", "int", "str", "plain-dict"],
)
def test_take_with_non_stateful_value_raises_invalid_app_state(tmp_path: Path, value: Any, type_name: str) -> None:
    path = tmp_path / "snap"
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(path), {"model": Net(), "weights": value})
    exc = info.value
    assert isinstance(exc, TypeError)
    message = str(exc)
    assert "'weights'" in message
    assert type_name in message
    assert "StateDict" in message
    assert files_of(path) == {}


def test_restore_with_non_stateful_value_raises_invalid_app_state(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot(str(path)).restore({"extras": torch.zeros(8)})
    assert isinstance(info.value, TypeError)
    assert "'extras'" in str(info.value)


@pytest.mark.parametrize(
    "app_state",
    [[Net()], Net(), None, "model"],
    ids=["list", "module", "none", "str"],
)
def test_take_with_non_dict_app_state_raises_invalid_app_state(tmp_path: Path, app_state: Any) -> None:
    path = tmp_path / "snap"
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(path), app_state)
    exc = info.value
    assert isinstance(exc, TypeError)
    assert type(app_state).__name__ in str(exc)
    assert "dict" in str(exc)
    assert files_of(path) == {}


@pytest.mark.parametrize("key", ["", 3], ids=["empty", "int"])
def test_take_with_bad_app_state_key_raises_invalid_app_state(tmp_path: Path, key: Any) -> None:
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(tmp_path / "snap"), {key: StateDict(a=1)})
    assert isinstance(info.value, TypeError)
    assert repr(key) in str(info.value)
