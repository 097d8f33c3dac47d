"""Equal pieces in an incremental snapshot: reuse goes by content, so every piece whose bytes a
base holds references that one base piece, within a tensor and across tensors. Restores must
neither refuse such a manifest nor take two tensors that begin alike, or that are equal and
reference the same base pieces, for tied weights."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.verify import verify_snapshot

from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, pieces

NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)


def test_a_tensor_of_equal_pieces(tmp_path: Path) -> None:
    # regression: restore refused this manifest ("asks for more bytes of new tensors than stored")
    state = {"s": StateDict(zeros=torch.zeros(NUMEL), ones=torch.ones(2 * NUMEL, dtype=torch.float64))}
    Snapshot.take(str(tmp_path / "a"), state)
    state["s"]["zeros"][0] = 1.0
    expected = copy.deepcopy(dict(state["s"]))
    b = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    ones = pieces(b, "s/ones")
    assert all(p.base == "../a" for p in ones) and len({(p.location, p.byte_range) for p in ones}) == 1
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("s"), expected)
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("s/ones"), expected["ones"])
    target = {"s": StateDict(zeros=torch.empty(NUMEL), ones=torch.empty(2 * NUMEL, dtype=torch.float64))}
    Snapshot(str(tmp_path / "b")).restore(target)
    assert_bit_exact(dict(target["s"]), expected)
    assert verify_snapshot(str(tmp_path / "b")).ok


def test_tensors_that_begin_alike_are_not_tied(tmp_path: Path) -> None:
    # regression: read_object silently gave y the value of x (one new tensor for both), because
    # a restore took entries whose first pieces are the same for tied weights
    state = {"s": StateDict(x=torch.arange(NUMEL, dtype=torch.float32), y=torch.arange(NUMEL, dtype=torch.float32))}
    Snapshot.take(str(tmp_path / "a"), state)
    state["s"]["y"][-1] = 7.0
    expected = copy.deepcopy(dict(state["s"]))
    b = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    assert pieces(b, "s/x")[0] == pieces(b, "s/y")[0]
    loaded = Snapshot(str(tmp_path / "b")).read_object("s")
    assert_bit_exact(loaded, expected)
    assert loaded["x"].data_ptr() != loaded["y"].data_ptr()


def test_tied_weights_stay_tied(tmp_path: Path) -> None:
    shared = torch.arange(NUMEL, dtype=torch.float32)
    state = {"s": StateDict(embed=shared, head=shared, other=torch.zeros(NUMEL))}
    Snapshot.take(str(tmp_path / "a"), state)
    shared[-1] = -1.0
    b = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    assert pieces(b, "s/embed") == pieces(b, "s/head")
    loaded = Snapshot(str(tmp_path / "b")).read_object("s")
    assert loaded["embed"].data_ptr() == loaded["head"].data_ptr()
    assert_bit_exact(loaded["head"], shared)


@pytest.mark.parametrize("numel", [NUMEL, CHUNK_BYTES // 4], ids=["four-pieces", "one-piece"])
def test_distinct_equal_tensors_referencing_one_base_piece_restore_as_distinct_tensors(
    tmp_path: Path, numel: int
) -> None:
    # found by a review: both entries name the same base pieces, so a restore into new tensors
    # gave them one tensor (writing one changed the other): Adam's exp_avg and exp_avg_sq of a
    # parameter with zero gradients came back as one tensor
    Snapshot.take(str(tmp_path / "a"), {"s": StateDict(x=torch.zeros(numel))})
    b = Snapshot.take(
        str(tmp_path / "b"), {"s": StateDict(x=torch.zeros(numel), y=torch.zeros(numel))}, base=str(tmp_path / "a")
    )
    assert pieces(b, "s/x") == pieces(b, "s/y") and all(p.base == "../a" for p in pieces(b, "s/x"))
    for loaded in (Snapshot(str(tmp_path / "b")).read_object("s"), _restored(tmp_path / "b")):
        assert loaded["x"].data_ptr() != loaded["y"].data_ptr()
        loaded["x"].add_(1)
        assert not loaded["y"].any()


def _restored(path: Path) -> StateDict:
    state = StateDict()
    Snapshot(str(path)).restore({"s": state})
    return state


def test_an_optimizer_restored_fresh_from_an_incremental_snapshot_keeps_its_states_apart(tmp_path: Path) -> None:
    param = torch.nn.Parameter(torch.randn(NUMEL))
    optimizer = torch.optim.Adam([param])
    param.grad = torch.zeros_like(param)
    optimizer.step()  # exp_avg and exp_avg_sq stay zero: equal bytes
    Snapshot.take(str(tmp_path / "a"), {"o": optimizer})
    optimizer.step()
    Snapshot.take(str(tmp_path / "b"), {"o": optimizer}, base=str(tmp_path / "a"))
    fresh_param = torch.nn.Parameter(param.detach().clone())
    fresh = torch.optim.Adam([fresh_param])
    Snapshot(str(tmp_path / "b")).restore({"o": fresh})
    state = fresh.state[fresh_param]
    assert state["exp_avg"].data_ptr() != state["exp_avg_sq"].data_ptr()
