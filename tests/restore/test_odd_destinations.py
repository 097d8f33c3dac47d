"""Destinations a restore cannot fill as they are: tied views with a lazy conj/neg bit, sparse
layouts, views that partly share memory, expanded tensors. Each is refused with a
``StateMismatchError`` naming the logical paths, before anything is read into them, on the
version-5 column path and the per-entry path alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import rewrite_as_v4

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import StateMismatchError


@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize("lazy", ["neg", "conj"])
@pytest.mark.parametrize("same_piece", [True, False], ids=["tied-when-taken", "untied-when-taken"])
def test_tied_destinations_one_a_negated_or_conjugated_view_are_refused(
    version: int, lazy: str, same_piece: bool, tmp_path: Path
) -> None:
    # found by a review: such a view of the same memory was taken for the same destination (the
    # saved values were read once and the view then read them negated: a silent wrong value), or
    # comparing it raised torch's raw RuntimeError.
    value = torch.arange(6.0) * (1 + 1j) if lazy == "conj" else torch.arange(6.0)
    other = value if same_piece else value.clone()
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(a=value, b=other)})
    if version == 4:
        rewrite_as_v4(tmp_path / "snap")
    shared = torch.zeros_like(value)
    view = shared.conj() if lazy == "conj" else shared._neg_view()
    assert view.is_conj() == (lazy == "conj") and view.is_neg() == (lazy == "neg")
    for destinations in ({"a": shared, "b": view}, {"a": view, "b": shared}):
        with pytest.raises(StateMismatchError, match="negated or conjugated view"):
            Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(**destinations)})


def test_a_negated_view_alone_receives_the_saved_values(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(a=torch.arange(6.0))})
    view = torch.zeros(6)._neg_view()
    Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=view)})
    assert torch.equal(view.resolve_neg(), torch.arange(6.0))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_destination_of_the_saved_dtype_and_shape_is_a_mismatch(layout: str, tmp_path: Path) -> None:
    # found by a review: a raw RuntimeError from data_ptr()/is_contiguous() of the sparse destination
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(a=torch.arange(6.0), c=torch.eye(3))})
    sparse = torch.eye(3).to_sparse() if layout == "coo" else torch.eye(3).to_sparse_csr()
    with pytest.raises(StateMismatchError, match=r"'s/c'.*sparse_(coo|csr) tensor of dtype float32 shape \[3, 3\]"):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=torch.zeros(6), c=sparse)})
    state = StateDict(a=torch.zeros(6), c=sparse)
    Snapshot(str(tmp_path / "snap")).restore({"s": state}, strict=False)  # loaded new, handed to load_state_dict
    assert torch.equal(state["c"].to_dense(), torch.eye(3)) and torch.equal(state["a"], torch.arange(6.0))


@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize("many", [False, True], ids=["few", "among-many"])
def test_destinations_that_partly_share_memory_are_refused_before_any_read(
    version: int, many: bool, tmp_path: Path
) -> None:
    # found by a review: both were read in place, so one held part of the other's bytes, a checksum
    # failure blamed on the snapshot ("the snapshot is corrupt"), or no error when one was verified
    # before the other landed. Version 5 plans them as a run, version 4 one by one.
    saved = {"a": torch.arange(4.0), "b": torch.arange(4.0) + 10}
    others = {f"o{i}": torch.full((3,), float(i)) for i in range(50 if many else 0)}
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(**saved, **others)})
    if version == 4:
        rewrite_as_v4(tmp_path / "snap")
    base = torch.full((6,), -1.0)
    destinations = {"a": base[0:4], "b": base[2:6], **{k: torch.zeros(3) for k in others}}
    with pytest.raises(StateMismatchError, match=r"'s/a' and 's/b' in place: .* partly share memory"):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(**destinations)})
    assert torch.equal(base, torch.full((6,), -1.0))  # nothing was read into them
    assert all(not v.any() for k, v in destinations.items() if k in others)
    adjacent = torch.zeros(8)  # views that touch but do not overlap are restored
    state = StateDict(a=adjacent[0:4], b=adjacent[4:8], **{k: torch.zeros(3) for k in others})
    Snapshot(str(tmp_path / "snap")).restore({"s": state})
    assert torch.equal(adjacent, torch.cat([saved["a"], saved["b"]]))


@pytest.mark.parametrize("strict", [True, False])
def test_an_expanded_destination_is_refused(strict: bool, tmp_path: Path) -> None:
    # found by a review: torch's raw RuntimeError ("more than one element of the written-to tensor
    # refers to a single memory location") from the copy into it
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(a=torch.arange(4.0))})
    with pytest.raises(StateMismatchError, match=r"'s/a' into a tensor whose elements share memory .*strides \[0\]"):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=torch.zeros(1).expand(4))}, strict=strict)
