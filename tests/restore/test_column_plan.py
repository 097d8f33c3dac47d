"""Planning a restore from a version-5 manifest's columns (``snapshotkit._restore.columns``):
taken for version 5 only, and the same results, reports and errors as the per-entry path."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import flip_byte, piece_of, rewrite_as_v4
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.columnar import ColumnarManifest
from snapshotkit._plan.flatten import flatten
from snapshotkit._restore.columns import ColumnView, column_rank_view
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.plan import _plan_leaves, subtree
from snapshotkit.errors import ChecksumMismatchError, SnapshotkitError, StateMismatchError

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool, torch.complex64)


def _planned(path: Path, destinations: dict[str, Any]) -> tuple[set[str], set[str], LeafLoader]:
    view = column_rank_view(Snapshot(str(path)).metadata, 0)
    assert isinstance(view, ColumnView)
    _, leaves = subtree(view, "s")
    loader = LeafLoader(weights_only=True)
    known, thunks = _plan_leaves(leaves, flatten(destinations, "s").leaves, loader, strict=True, module=False)
    return set(known), set(thunks), loader


def test_a_version_5_snapshot_is_planned_from_its_columns_and_version_4_is_not(tmp_path: Path) -> None:
    saved = {"a": torch.randn(4, 8), "b": torch.arange(10), "c": torch.rand(3)}
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(**saved), "n": StateDict(x=1)})
    destinations = {"a": torch.empty(4, 8), "b": torch.empty(10, dtype=torch.int64), "c": torch.empty(3)}
    fast, general, loader = _planned(tmp_path / "snap", destinations)
    assert fast == {"s/a", "s/b", "s/c"} and not general
    assert all(read.direct is not None for read in loader.reads)
    state = StateDict(**destinations)
    Snapshot(str(tmp_path / "snap")).restore({"s": state})
    assert all(state[k] is destinations[k] and torch.equal(state[k], v) for k, v in saved.items())

    rewrite_as_v4(tmp_path / "snap")
    metadata = Snapshot(str(tmp_path / "snap")).metadata
    assert metadata.format_version == 4 and column_rank_view(metadata, 0) is None


def test_the_columns_build_the_same_entries_and_pieces_as_the_mapping(tmp_path: Path) -> None:
    Snapshot.take(
        str(tmp_path / "snap"),
        {
            "s": StateDict(
                a=torch.randn(3, 2), b=torch.arange(4, dtype=torch.int8), q=torch.tensor([], dtype=torch.half)
            )
        },
    )
    manifest = Snapshot(str(tmp_path / "snap")).metadata.manifest
    assert isinstance(manifest, ColumnarManifest)
    view = column_rank_view(Snapshot(str(tmp_path / "snap")).metadata, 0)
    assert view is not None
    for path, slot in view.slots.items():
        assert view[path] == manifest[f"0/{path}"]
        if type(slot) is int and view.columns.piece_offsets[slot + 1] - view.columns.piece_offsets[slot] == 1:
            first = view.columns.piece_offsets[slot]
            assert view.lists.piece(int(first)) == manifest[f"0/{path}"].pieces[0]  # type: ignore[union-attr]
    assert dict(view) == {key[2:]: entry for key, entry in manifest.items()}


def test_damaged_bytes_name_the_logical_path_on_the_column_path(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"s": StateDict(**{f"t{i}": torch.rand(16) for i in range(6)})})
    location, start, _ = piece_of(path, "s/t4")
    flip_byte(location, start + 3)
    destinations = {f"t{i}": torch.zeros(16) for i in range(6)}
    assert _planned(path, destinations)[0] == {f"s/t{i}" for i in range(6)}
    with pytest.raises(ChecksumMismatchError, match=r"logical path 's/t4'"):
        Snapshot(str(path)).restore({"s": StateDict(**destinations)})


def _tensor(draw: Any, dtype: torch.dtype, *, matrix: bool = False) -> torch.Tensor:
    shape = draw(
        st.lists(st.integers(2, 4), min_size=2, max_size=2) if matrix else st.lists(st.integers(0, 3), max_size=2)
    )
    seed = draw(st.integers(0, 2**16))
    values = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed)) * 10
    return values.to(dtype)


@st.composite
def _cases(draw: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
    """A saved state, destinations for it (plain, non-contiguous, tied, another dtype or shape,
    a lazy conj or neg bit, missing and extra keys) and ``strict``."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    hows = {
        name: draw(
            st.sampled_from(("plain", "plain", "transposed", "tied", "dtype", "shape", "missing", "conj", "neg"))
        )
        for name in names
    }
    saved = {
        name: _tensor(draw, draw(st.sampled_from(DTYPES)), matrix=how == "transposed") for name, how in hows.items()
    }
    destinations: dict[str, Any] = {}
    for name, value in saved.items():
        how = hows[name]
        # a tie to a destination with a lazy conj/neg bit too: it once raised torch's RuntimeError
        # on both paths (the tied values were compared as bytes, the lazy bit not applied)
        tieable = sorted(destinations)
        if how == "plain" or (how == "tied" and not tieable):
            destinations[name] = torch.zeros_like(value)
        elif how == "transposed":
            destinations[name] = torch.zeros_like(value.t().contiguous()).t()
        elif how == "tied":
            destinations[name] = destinations[draw(st.sampled_from(tieable))]
        elif how == "dtype":
            destinations[name] = torch.zeros(
                value.shape, dtype=torch.float64 if value.dtype != torch.float64 else torch.int32
            )
        elif how == "shape":
            destinations[name] = torch.zeros(value.numel() + 1, dtype=value.dtype)
        elif how == "conj":  # a lazy conj bit (complex dtypes; any other dtype's conj() is the tensor itself)
            destinations[name] = torch.zeros_like(value).conj()
        elif how == "neg":  # a lazy neg bit (bool tensors cannot be negated: a plain one)
            destinations[name] = torch.zeros_like(value)
            if value.dtype != torch.bool:
                destinations[name] = destinations[name]._neg_view()
    if draw(st.booleans()):
        destinations["extra"] = torch.zeros(2)
    return saved, destinations, draw(st.booleans())


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` that keeps its lazy conj or neg bit (``clone()`` resolves them)."""
    if tensor.is_conj():
        return tensor.conj().clone().conj()
    if tensor.is_neg():
        return tensor._neg_view().clone()._neg_view()
    return tensor.clone()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of the values of ``tensor`` (a lazy conj or neg bit applied)."""
    return tensor.resolve_conj().resolve_neg().contiguous().view(-1).view(torch.uint8)


def _restore(path: Path, destinations: dict[str, Any], strict: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    copies = {k: _copy(v) if isinstance(v, torch.Tensor) else v for k, v in destinations.items()}
    # tied destinations stay tied in the copy
    for k, v in destinations.items():
        for k2 in destinations:
            if k2 < k and destinations[k2] is v:
                copies[k] = copies[k2]
    state = StateDict(**copies)
    try:
        report = Snapshot(str(path)).restore({"s": state}, strict=strict)
    except SnapshotkitError as exc:
        return (type(exc).__name__, str(exc).replace(str(path), "<snap>")), {}
    return report, dict(state)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_the_column_path_restores_as_the_per_entry_path(
    case: tuple[dict[str, torch.Tensor], dict[str, Any], bool],
) -> None:
    saved, destinations, strict = case
    with tempfile.TemporaryDirectory() as scratch:
        v5, v4 = Path(scratch) / "v5", Path(scratch) / "v4"
        Snapshot.take(str(v5), {"s": StateDict(**saved)})
        shutil.copytree(v5, v4)
        rewrite_as_v4(v4)
        outcome5, state5 = _restore(v5, destinations, strict)
        outcome4, state4 = _restore(v4, destinations, strict)
        if isinstance(outcome4, tuple):
            outcome5 = (outcome5[0], outcome5[1].replace("v5", "v4")) if isinstance(outcome5, tuple) else outcome5
    assert outcome5 == outcome4
    assert state5.keys() == state4.keys()
    for key, value in state4.items():
        other = state5[key]
        assert type(other) is type(value)
        if isinstance(value, torch.Tensor):
            assert other.dtype == value.dtype and other.shape == value.shape
            assert torch.equal(_bytes(other), _bytes(value))
        else:
            assert other == value


def test_a_tied_destination_is_compared_not_read_twice_on_the_column_path(tmp_path: Path) -> None:
    value = torch.arange(6.0)
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(a=value, b=value.clone() + 1)})
    shared = torch.zeros(6)
    with pytest.raises(StateMismatchError):
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(a=shared, b=shared)})


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize(
    "make_odd",
    [
        lambda: torch.zeros(2, 4).t(),  # not contiguous
        lambda: torch.zeros(4, 2, dtype=torch.complex64).conj(),
        lambda: torch.zeros(4, 2)._neg_view(),
        lambda: torch.zeros(4, 2).to_sparse(),
        # found by a review: is_contiguous() and data_ptr() raise a raw RuntimeError on these
        lambda: torch.eye(4, 2).to_sparse(),
        lambda: torch.eye(4, 2).to_sparse_csr(),
    ],
    ids=["non-contiguous", "conj", "neg", "sparse", "sparse-values", "sparse-csr"],
)
def test_one_destination_that_is_not_plain_memory_is_found_among_plain_ones(
    make_odd: Callable[[], torch.Tensor], tmp_path: Path
) -> None:
    # _plain_memory reads each property of all destinations in one pass, and builds no column when
    # all are plain memory: one odd destination anywhere among plain ones still goes the general way.
    odd = make_odd()
    saved = {f"t{i}": torch.ones(4, 2) for i in range(6)}
    for where in (0, 2, 5):
        path = tmp_path / f"snap{where}"
        Snapshot.take(str(path), {"s": StateDict(**saved, odd=torch.ones(4, 2, dtype=odd.dtype))})
        destinations = {name: torch.zeros(4, 2) for name in saved}
        assert _planned(path, {**destinations, "odd": torch.zeros(4, 2, dtype=odd.dtype)})[:2] == (
            {f"s/t{i}" for i in range(6)} | {"s/odd"},
            set(),
        )
        names = list(destinations)
        names.insert(where, "odd")  # the odd one's place among the leaves: its key order
        mixed = {name: odd if name == "odd" else destinations[name] for name in names}
        if odd.layout != torch.strided:  # the general way refuses it (strict): not read in place
            with pytest.raises(StateMismatchError, match="'s/odd'"):
                _planned(path, mixed)
        else:
            assert _planned(path, mixed)[:2] == ({f"s/t{i}" for i in range(6)}, {"s/odd"})


def test_only_a_complex_tensor_carries_a_conj_bit() -> None:
    # _plain_memory asks is_conj() of complex destinations alone: torch never sets the bit on another dtype.
    assert not torch.zeros(3).conj().is_conj() and torch.zeros(3, dtype=torch.complex64).conj().is_conj()
    with pytest.raises(RuntimeError):
        torch._C._set_conj(torch.zeros(3), True)
