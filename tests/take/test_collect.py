"""``snapshotkit._take.collect``: values that cannot be stored are refused before anything is written."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import Net, assert_nothing_committed

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import UnsupportedValueError

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
