"""A failed restore says whether it may have changed its destinations (``_runtime/touched.py``):
what ``restore_latest`` decides between ``None`` and ``PartialRestoreError`` with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import flip_byte, piece_of

from snapshotkit import Snapshot, StateDict
from snapshotkit._runtime.touched import mark_touched, state_touched
from snapshotkit.errors import ChecksumMismatchError, StateMismatchError


class _Refuses(StateDict):
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise ValueError("refused")


def _damaged(tmp_path: Path) -> str:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"s": StateDict(w=torch.arange(64.0))})
    data_object, start, _ = piece_of(path, "s/w")
    flip_byte(data_object, start)
    return str(path)


def test_damaged_bytes_read_into_the_callers_tensor_touch_it(tmp_path: Path) -> None:
    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(_damaged(tmp_path)).restore({"s": StateDict(w=torch.zeros(64))})
    assert state_touched(info.value)


def test_damaged_bytes_read_into_a_new_tensor_touch_nothing(tmp_path: Path) -> None:
    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(_damaged(tmp_path)).restore({"s": StateDict(w=torch.zeros(1))}, strict=False)
    assert not state_touched(info.value)


def test_a_refusal_before_reading_touches_nothing_and_a_failing_load_does(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    Snapshot.take(path, {"s": StateDict(w=torch.arange(4.0))})
    with pytest.raises(StateMismatchError) as mismatch:
        Snapshot(path).restore({"s": StateDict(w=torch.zeros(5))})
    assert not state_touched(mismatch.value)
    with pytest.raises(ValueError, match="refused") as refused:
        Snapshot(path).restore({"s": _Refuses(w=torch.zeros(4))})
    assert state_touched(refused.value)


def test_a_mark_only_becomes_more_cautious() -> None:
    error = ValueError("x")
    assert not state_touched(error)
    mark_touched(error, True)
    mark_touched(error, False)
    assert state_touched(error)
