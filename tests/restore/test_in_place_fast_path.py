"""The in-place fast path of a restore (``LeafLoader.add_in_place``): plain contiguous CPU
destinations of one raw piece each are planned with no per-entry thunk; everything else goes
through ``LeafLoader.add`` as before, with the same results and errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import flip_byte, piece_of

from snapshotkit import Snapshot, StateDict
from snapshotkit._plan.flatten import flatten
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import _plan_leaves, rank_view, subtree
from snapshotkit._runtime.touched import state_touched
from snapshotkit.errors import ChecksumMismatchError, IntegrityError, StateMismatchError


def _planned(path: Path, destinations: dict[str, Any], *, strict: bool = True) -> tuple[set[str], set[str], LeafLoader]:
    """Which saved leaves of key ``s`` the fast path planned, which ``add`` did, and the loader."""
    view = rank_view(Snapshot(str(path)).metadata, 0)
    _, leaves = subtree(view, "s")
    loader = LeafLoader(weights_only=True)
    current = flatten(destinations, "s").leaves
    known, thunks = _plan_leaves(leaves, current, loader, strict=strict, module=False)
    return set(known), set(thunks), loader


def _take(path: Path, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    Snapshot.take(str(path), {"s": StateDict(**tensors)})
    return tensors


def test_plain_cpu_destinations_take_the_fast_path_and_restore_bit_exact(tmp_path: Path) -> None:
    saved = _take(tmp_path / "snap", a=torch.randn(4, 8), b=torch.arange(10, dtype=torch.int64), c=torch.rand(3))
    destinations = {"a": torch.empty(4, 8), "b": torch.nn.Parameter(torch.empty(10, dtype=torch.int64), False)}
    destinations["c"] = torch.empty(3)
    fast, general, loader = _planned(tmp_path / "snap", destinations)
    assert fast == {"s/a", "s/b", "s/c"} and not general
    assert [read.direct is not None for read in loader.reads] == [True] * 3
    state = StateDict(**destinations)
    Snapshot(str(tmp_path / "snap")).restore({"s": state})
    for key, value in saved.items():
        assert state[key] is destinations[key] and torch.equal(state[key], value)


def test_destinations_the_fast_path_refuses_go_through_add_and_restore_bit_exact(tmp_path: Path) -> None:
    saved = _take(
        tmp_path / "snap",
        transposed=torch.randn(4, 6),
        conj=torch.randn(5, dtype=torch.complex64),
        empty=torch.empty(0, 3),
        other_dtype=torch.arange(6, dtype=torch.int32),
        other_shape=torch.arange(6.0),
        plain=torch.arange(3.0),
    )
    destinations: dict[str, Any] = {
        "transposed": torch.empty(6, 4).t(),  # not contiguous: filled through a bounce buffer
        "conj": torch.zeros(5, dtype=torch.complex64).conj(),  # a lazy conj bit on its memory
        "empty": torch.empty(0, 3),
        "other_dtype": torch.empty(6, dtype=torch.int64),
        "other_shape": torch.empty(2, 3),
        "plain": torch.empty(3),
    }
    fast, general, _ = _planned(tmp_path / "snap", destinations, strict=False)
    assert fast == {"s/plain"}
    assert general == {f"s/{key}" for key in destinations if key != "plain"}
    state = StateDict(**destinations)
    report = Snapshot(str(tmp_path / "snap")).restore({"s": state}, strict=False)
    assert report.missing_keys == () and report.unexpected_keys == ()
    assert state["transposed"] is destinations["transposed"]
    assert torch.equal(state["transposed"], saved["transposed"])
    for key in ("other_dtype", "other_shape"):  # strict=False: a new tensor with the saved value
        assert state[key] is not destinations[key] and torch.equal(state[key], saved[key])
    assert torch.equal(state["conj"].resolve_conj(), saved["conj"]) and state["empty"].shape == (0, 3)


def test_a_destination_of_another_dtype_or_shape_is_still_refused_with_strict(tmp_path: Path) -> None:
    _take(tmp_path / "snap", a=torch.arange(6.0))
    with pytest.raises(StateMismatchError, match=r"'s/a'.*dtype float32 shape \[6\].*dtype float64"):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=torch.empty(6, dtype=torch.float64))})
    with pytest.raises(StateMismatchError, match=r"'s/a'.*shape \[6\].*shape \[2, 3\]"):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=torch.empty(2, 3))})


def test_an_optimizer_state_of_another_shape_is_a_mismatched_key_with_strict_false(tmp_path: Path) -> None:
    def adam(size: int) -> torch.optim.Adam:
        parameter = torch.nn.Parameter(torch.ones(size))
        optimizer = torch.optim.Adam([parameter])
        parameter.grad = torch.ones(size)
        optimizer.step()
        return optimizer

    Snapshot.take(str(tmp_path / "snap"), {"opt": adam(4)})
    report = Snapshot(str(tmp_path / "snap")).restore({"opt": adam(5)}, strict=False)
    assert "opt/state/0/exp_avg" in report.mismatched_keys


def test_tied_destinations_leave_the_fast_path_for_the_comparison(tmp_path: Path) -> None:
    shared = torch.empty(8)
    _take(tmp_path / "different", a=torch.arange(8.0), b=torch.arange(8.0) + 1)
    fast, general, _ = _planned(tmp_path / "different", {"a": shared, "b": shared})
    assert fast == {"s/a"} and general == {"s/b"}
    with pytest.raises(StateMismatchError, match=r"'s/b' and 's/a' are one tensor in the app state"):
        Snapshot(str(tmp_path / "different")).restore({"s": StateDict(a=shared, b=shared)})
    # Tied in the snapshot too (one stored tensor): read once, into the shared memory.
    value = torch.arange(8.0)
    Snapshot.take(str(tmp_path / "tied"), {"s": StateDict(a=value, b=value)})
    fast, general, loader = _planned(tmp_path / "tied", {"a": shared, "b": shared})
    assert fast == {"s/a"} and general == {"s/b"} and len(loader.reads) == 1
    state = StateDict(a=shared, b=shared)
    Snapshot(str(tmp_path / "tied")).restore({"s": state})
    assert state["a"] is state["b"] is shared and torch.equal(shared, value)


def test_damaged_bytes_read_in_place_name_the_path_and_load_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    _take(path, **{f"t{i}": torch.full((16,), float(i)) for i in range(8)})
    data_object, start, _ = piece_of(path, "s/t5")
    flip_byte(data_object, start)
    loaded: list[dict[str, Any]] = []

    class Recording(StateDict):
        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            loaded.append(state_dict)
            super().load_state_dict(state_dict)

    destinations = {f"t{i}": torch.zeros(16) for i in range(8)}
    assert _planned(path, destinations)[0] == {f"s/t{i}" for i in range(8)}
    with pytest.raises(ChecksumMismatchError, match=r"logical path 's/t5'") as info:
        Snapshot(str(path)).restore({"s": Recording(**destinations)})
    assert isinstance(info.value, IntegrityError)
    assert state_touched(info.value)  # bytes may have landed in the caller's tensors
    assert not loaded  # and the state was not passed off as restored
