"""Runs of in-place reads (``snapshotkit._restore.runs``): the plain tensors of a version-5
restore read as arrays, with the checks, budgets and errors of the per-piece pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _snapshots import flip_byte, piece_of
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.entries import Piece
from snapshotkit._plan.reads import MAX_GAP_BYTES
from snapshotkit._restore.runs import InPlaceRun, _batches
from snapshotkit._runtime.touched import state_touched
from snapshotkit.errors import ChecksumMismatchError, StateMismatchError, TruncatedDataError


def _saved(count: int, numel: int = 64) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(count)
    return {f"t{i:03d}": torch.rand(numel, generator=generator) for i in range(count)}


def _run(location: list[int], start: list[int], length: list[int]) -> InPlaceRun:
    n = len(start)
    return InPlaceRun(
        [f"p{i}" for i in range(n)],
        [],
        np.arange(n, dtype=np.int64),
        np.array(location, dtype=np.int64),
        np.array(start, dtype=np.int64),
        np.array(length, dtype=np.int64),
        np.zeros(n, dtype=np.uint32),
        ["a", "b", "c"],
        lambda i: Piece("a", (0, 0), "crc32c:00000000"),
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 20_000), st.integers(1, 3000)), min_size=1, max_size=40),
    st.integers(1, 12_000),
)
def test_batches_cover_every_piece_once_in_disjoint_reads_within_the_limits(
    pieces: list[tuple[int, int, int]], max_batch_bytes: int
) -> None:
    run = _run(*(list(column) for column in zip(*pieces, strict=True)))
    batches = _batches(run, max_batch_bytes)
    members = np.concatenate([batch.members for batch in batches])
    assert sorted(members.tolist()) == list(range(len(pieces)))
    for batch in batches:
        starts, ends = run.start[batch.members], run.start[batch.members] + run.length[batch.members]
        assert {run.locations[i] for i in run.location[batch.members].tolist()} == {batch.location}
        assert batch.start == starts[0] and batch.end == ends[-1]
        gaps = starts[1:] - ends[:-1]
        assert (gaps >= 0).all() and (gaps <= MAX_GAP_BYTES).all()  # in byte order, disjoint, close
        assert batch.gap_bytes == int(gaps.sum()) and batch.max_gap == (int(gaps.max()) if len(gaps) else 0)
        assert len(batch.members) == 1 or batch.end - batch.start <= max_batch_bytes


def test_a_small_budget_and_gaps_left_by_refused_tensors_restore_bit_exact(tmp_path: Path) -> None:
    saved = _saved(40)
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(**saved)})
    destinations: dict[str, Any] = {k: torch.zeros_like(v) for k, v in saved.items()}
    destinations["t007"] = torch.zeros(64, dtype=torch.float64)  # not in the run: a gap in the ranged read
    destinations["t020"] = torch.zeros(64).conj()  # a complex-free conj is plain; a neg view is not
    destinations["t021"] = torch._neg_view(torch.zeros(64))
    state = StateDict(**destinations)
    report = Snapshot(str(tmp_path / "snap")).restore({"s": state}, strict=False, memory_budget_bytes=1000)
    assert not report.missing_keys and not report.unexpected_keys
    for key, value in saved.items():
        assert torch.equal(state[key].to(value.dtype), value), key
    assert state["t000"] is destinations["t000"]


def test_a_damaged_byte_in_a_run_names_its_path_and_marks_the_state_touched(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    saved = _saved(30)
    Snapshot.take(str(path), {"s": StateDict(**saved)})
    location, start, _ = piece_of(path, "s/t017")
    flip_byte(location, start + 5)
    state = StateDict(**{k: torch.zeros_like(v) for k, v in saved.items()})
    with pytest.raises(ChecksumMismatchError, match=r"logical path 's/t017'") as info:
        Snapshot(str(path)).restore({"s": state}, memory_budget_bytes=2048)
    assert state_touched(info.value)


def test_a_truncated_data_object_under_a_run_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    saved = _saved(10)
    Snapshot.take(str(path), {"s": StateDict(**saved)})
    location, start, _ = piece_of(path, "s/t009")
    location.write_bytes(location.read_bytes()[: start + 10])
    with pytest.raises(TruncatedDataError, match=r"holding .s/t000.* is shorter than the manifest says"):
        Snapshot(str(path)).restore({"s": StateDict(**{k: torch.zeros_like(v) for k, v in saved.items()})})


def test_memory_tied_across_app_state_keys_meets_the_run_and_is_compared(tmp_path: Path) -> None:
    saved = _saved(5)
    Snapshot.take(str(tmp_path / "snap"), {"a": StateDict(**saved), "b": StateDict(x=saved["t003"].clone())})
    shared = {k: torch.zeros_like(v) for k, v in saved.items()}
    a, b = StateDict(**shared), StateDict(x=shared["t003"])
    Snapshot(str(tmp_path / "snap")).restore({"a": a, "b": b})  # equal values: restored, still tied
    assert b["x"] is shared["t003"] and torch.equal(b["x"], saved["t003"])

    Snapshot.take(str(tmp_path / "other"), {"a": StateDict(**saved), "b": StateDict(x=saved["t003"] + 1)})
    with pytest.raises(StateMismatchError, match="tied"):
        Snapshot(str(tmp_path / "other")).restore({"a": StateDict(**shared), "b": StateDict(x=shared["t003"])})


def test_a_destination_of_another_shape_in_a_run_of_many_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    saved = _saved(50)
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(**saved)})
    destinations = {k: torch.zeros_like(v) for k, v in saved.items()}
    destinations["t031"] = torch.zeros(8, 8)
    with pytest.raises(StateMismatchError, match="s/t031") as info:
        Snapshot(str(tmp_path / "snap")).restore({"s": StateDict(**destinations)})
    assert not state_touched(info.value)
    assert all(not v.any() for v in destinations.values())


def test_the_runs_of_several_keys_share_reads_and_a_damaged_byte_names_its_own_path(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    a, b = _saved(12), _saved(7)
    Snapshot.take(str(path), {"a": StateDict(**a), "b": StateDict(**b)})
    location, start, _ = piece_of(path, "b/t003")
    flip_byte(location, start + 1)
    state_a, state_b = (StateDict(**{k: torch.zeros_like(v) for k, v in s.items()}) for s in (a, b))
    with pytest.raises(ChecksumMismatchError, match=r"logical path 'b/t003'"):
        Snapshot(str(path)).restore({"a": state_a, "b": state_b})
    flip_byte(location, start + 1)
    Snapshot(str(path)).restore({"a": state_a, "b": state_b})
    assert all(torch.equal(state_a[k], v) for k, v in a.items()) and all(
        torch.equal(state_b[k], v) for k, v in b.items()
    )
