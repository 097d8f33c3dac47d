"""Repeated takes of one structure reuse the plan (``_take/plan_cache.py``), and only then.

Each test takes real snapshots and restores them; which takes reused a plan is read from the
real ``prepare_take`` (recorded, not replaced)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._take import engine, plan_cache
from snapshotkit._take.prepare import PreparedTake


@pytest.fixture
def reused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Whether each take of the test reused a plan, in order (the cache starts empty)."""
    plan_cache.forget()
    seen: list[bool] = []
    real = engine.prepare_take

    def recording(*args: Any, **kwargs: Any) -> PreparedTake:
        prepared = real(*args, **kwargs)
        seen.append(prepared.plan_reused)
        return prepared

    monkeypatch.setattr(engine, "prepare_take", recording)
    yield seen
    plan_cache.forget()


def state_at(step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {
        "w": torch.rand(64, 8, generator=generator),
        "b": torch.rand(8, generator=generator).to(torch.float16),
        "step": step,
        "lr": 0.1 / (step + 1),
        "history": set(range(step * 50)),  # an object whose serialized size grows every step
    }


def restored(path: Path, like: dict[str, Any]) -> dict[str, Any]:
    target = StateDict({k: torch.empty_like(v) if isinstance(v, torch.Tensor) else None for k, v in like.items()})
    Snapshot(str(path)).restore({"m": target})
    return dict(target)


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def test_later_takes_of_the_same_structure_reuse_the_plan(tmp_path: Path, reused: list[bool]) -> None:
    for step in range(4):
        state = state_at(step)
        Snapshot.take(str(tmp_path / f"s{step}"), {"m": StateDict(state)})
        assert_same(restored(tmp_path / f"s{step}", state), state)
    # the primitives changed value and the object its size at every step: the plan still holds
    assert reused == [False, True, True, True]
    names = [sorted(p.name for p in (tmp_path / f"s{step}" / "data").iterdir()) for step in range(4)]
    assert all(set(a).isdisjoint(b) for a in names for b in names if a is not b)  # a new take id every take


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.update(w=torch.rand(8, 64)), id="shape"),
        pytest.param(lambda s: s.update(b=s["b"].double()), id="dtype"),
        pytest.param(lambda s: s.update(extra=torch.ones(3)), id="entry added"),
        pytest.param(lambda s: s.pop("b"), id="entry removed"),
        pytest.param(lambda s: s.update(step=torch.tensor(7)), id="primitive became a tensor"),
        pytest.param(lambda s: s.update(lr="\udc80"), id="primitive became an object"),  # a lone surrogate
    ],
)
def test_a_changed_structure_plans_again(tmp_path: Path, reused: list[bool], change: Any) -> None:
    Snapshot.take(str(tmp_path / "a"), {"m": StateDict(state_at(0))})
    state = state_at(1)
    change(state)
    Snapshot.take(str(tmp_path / "b"), {"m": StateDict(state)})
    assert_same(restored(tmp_path / "b", state), state)
    Snapshot.take(str(tmp_path / "c"), {"m": StateDict(state)})
    assert_same(restored(tmp_path / "c", state), state)
    assert reused == [False, False, True]


def test_changed_sizes_or_patterns_plan_again(
    tmp_path: Path, reused: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = state_at(0)
    Snapshot.take(str(tmp_path / "a"), {"m": StateDict(state)})
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", "256")
    Snapshot.take(str(tmp_path / "b"), {"m": StateDict(state)})
    Snapshot.take(str(tmp_path / "c"), {"m": StateDict(state)}, replicated=["m/w"])
    Snapshot.take(str(tmp_path / "d"), {"m": StateDict(state)}, replicated=["m/w"])
    Snapshot.take(str(tmp_path / "e"), {"m": StateDict(state)}, replicated=["m/w"], include=["m/w"])
    assert reused == [False, False, False, True, False]
    assert len(Snapshot(str(tmp_path / "b")).get_manifest()["0/m/w"].pieces) == 8  # type: ignore[union-attr]
    for name in "abcd":
        assert_same(restored(tmp_path / name, state), state)


def test_the_cache_keeps_no_tensor_alive(tmp_path: Path, reused: list[bool]) -> None:
    state = state_at(0)
    watched = weakref.ref(state["w"])
    Snapshot.take(str(tmp_path / "a"), {"m": StateDict(state)})
    Snapshot.take(str(tmp_path / "b"), {"m": StateDict(state)})
    assert reused == [False, True]
    del state
    gc.collect()
    assert watched() is None


def test_prepare_async_fills_the_cache_for_the_first_async_take(tmp_path: Path, reused: list[bool]) -> None:
    state = state_at(0)
    Snapshot.prepare_async({"m": StateDict(state)})
    job = Snapshot.async_take(str(tmp_path / "a"), {"m": StateDict(state)})
    job.wait()
    assert reused == [True]  # prepare_async plans through prepare_take, not through the engine's
    assert_same(restored(tmp_path / "a", state), state)


def test_an_incremental_take_with_a_reused_plan(tmp_path: Path, reused: list[bool]) -> None:
    state = state_at(0)
    Snapshot.take(str(tmp_path / "a"), {"m": StateDict(state)})
    state["w"][0, 0] += 1
    state["step"] = 1
    Snapshot.take(str(tmp_path / "b"), {"m": StateDict(state)}, base=str(tmp_path / "a"))
    assert reused == [False, True]
    assert_same(restored(tmp_path / "b", state), state)
