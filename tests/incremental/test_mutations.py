"""Every way a tensor can change between a base and an incremental take is seen: the changed
pieces are written, never referenced; the others are referenced; the snapshot restores bit-exact.

Reuse compares content (a hash of the bytes), so in-place changes, changes through ``.data`` or a
NumPy view, an optimizer's step and a change made by another process through shared memory all
count, although none of them makes a new tensor object or bumps a version the take could see.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from snapshotkit import Snapshot, StateDict

from . import _children
from ._incremental import CHUNK_BYTES, SMALL_PIECES, assert_bit_exact, chunks, referenced

NUMEL = 4 * CHUNK_BYTES // 4  # float32: four full pieces


@pytest.fixture(autouse=True)
def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL_PIECES.items():
        monkeypatch.setenv(name, value)


def take_changed(tmp_path: Path, tensor: torch.Tensor, change: Callable[[], None]) -> list[str | None]:
    """Take ``{"s": {"t": tensor}}``, apply ``change``, take again against the first; check the
    second restores bit-exact and return which of its pieces are references."""
    state = {"s": StateDict(t=tensor)}
    Snapshot.take(str(tmp_path / "a"), state)
    before = chunks(tensor)
    change()
    after = chunks(state["s"]["t"])
    assert before != after, "the change changed nothing"
    expected = copy.deepcopy(dict(state["s"]))
    snapshot = Snapshot.take(str(tmp_path / "b"), state, base=str(tmp_path / "a"))
    found = referenced(snapshot, "s/t")
    assert found == ["../a" if b == a else None for b, a in zip(before, after, strict=True)]
    assert_bit_exact(Snapshot(str(tmp_path / "b")).read_object("s"), expected)
    target = {"s": StateDict(t=torch.zeros_like(tensor))}
    Snapshot(str(tmp_path / "b")).restore(target)
    assert_bit_exact(dict(target["s"]), expected)
    return found


def test_in_place_add(tmp_path: Path) -> None:
    t = torch.arange(NUMEL, dtype=torch.float32)
    found = take_changed(tmp_path, t, lambda: t[NUMEL // 2 : NUMEL // 2 + 3].add_(1))
    assert found == ["../a", "../a", None, "../a"]


def test_through_data(tmp_path: Path) -> None:
    p = torch.nn.Parameter(torch.arange(NUMEL, dtype=torch.float32))

    def change() -> None:
        p.data[0] = -5.0

    assert take_changed(tmp_path, p, change) == [None, "../a", "../a", "../a"]


def test_through_a_numpy_view(tmp_path: Path) -> None:
    t = torch.arange(NUMEL, dtype=torch.float32)

    def change() -> None:
        t.numpy()[NUMEL - 3] = 0.5  # shares memory with t; torch never sees the write

    assert take_changed(tmp_path, t, change) == ["../a", "../a", "../a", None]


@pytest.mark.slow
def test_by_another_process_through_shared_memory(tmp_path: Path) -> None:
    t = torch.arange(NUMEL, dtype=torch.float32).share_memory_()

    def change() -> None:
        child = mp.get_context("spawn").Process(target=_children.bump_shared, args=(t, CHUNK_BYTES // 4 + 1))
        child.start()
        child.join(60)
        assert child.exitcode == 0

    assert take_changed(tmp_path, t, change) == ["../a", None, "../a", "../a"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))  # 32 KiB weights each
    for p in model[0].parameters():
        p.requires_grad_(False)  # frozen: an optimizer step leaves it alone
    return model


def _step(model: torch.nn.Module, optim: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    optim.zero_grad()
    model(torch.randn(4, 64)).pow(2).mean().backward()
    optim.step()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_optimizer_step(tmp_path: Path, kind: str) -> None:
    model = _model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim: torch.optim.Optimizer = (
        torch.optim.SGD(trainable, lr=0.1, momentum=0.9) if kind == "sgd" else torch.optim.Adam(trainable, lr=0.1)
    )
    _step(model, optim, 1)  # the optimizer has state from here on
    app_state: dict[str, Any] = {"model": model, "optim": optim}
    Snapshot.take(str(tmp_path / "a"), app_state)
    _step(model, optim, 2)
    expected_model = copy.deepcopy(model.state_dict())
    expected_optim = copy.deepcopy(optim.state_dict())
    snapshot = Snapshot.take(str(tmp_path / "b"), app_state, base=str(tmp_path / "a"))

    assert referenced(snapshot, "model/0.weight") == ["../a", "../a"]  # frozen: 32 KiB, two pieces
    assert all(base is None for base in referenced(snapshot, "model/1.weight"))  # updated
    moments = ["momentum_buffer"] if kind == "sgd" else ["exp_avg", "exp_avg_sq"]
    for name in moments:
        found = referenced(snapshot, f"optim/state/0/{name}")
        assert found and all(base is None for base in found), name
    assert snapshot.metadata.bases == {"../a": Snapshot(str(tmp_path / "a")).metadata.snapshot_id}

    fresh = _model()
    fresh_optim = (
        torch.optim.SGD([p for p in fresh.parameters() if p.requires_grad], lr=0.5, momentum=0.1)
        if kind == "sgd"
        else torch.optim.Adam([p for p in fresh.parameters() if p.requires_grad], lr=0.5)
    )
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    Snapshot(str(tmp_path / "b")).restore({"model": fresh, "optim": fresh_optim})
    assert_bit_exact(fresh.state_dict(), expected_model)
    assert_bit_exact(fresh_optim.state_dict()["state"], expected_optim["state"])
    assert fresh_optim.state_dict()["param_groups"] == expected_optim["param_groups"]
