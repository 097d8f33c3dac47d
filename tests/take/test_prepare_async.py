"""``Snapshot.prepare_async``: the buffers it makes are the ones the next ``async_take`` stages into."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._runtime.staging import BufferPool, staging_budget
from snapshotkit._take import executors, writers
from snapshotkit._take.process_writer import ProcessWriter
from snapshotkit.errors import ConfigError, InvalidAppStateError, InvalidArgumentError

EXECUTORS = ["thread", "process"]
MIB = 1 << 20
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _fresh(fresh_writers: dict[tuple[str, int], Any]) -> None:
    """Every test starts without background writers (``fresh_writers``, tests/take/conftest.py)."""


def pool(executor: str) -> BufferPool:
    writer = executors.background_writer(executor, 19)
    buffers = writer._segments if isinstance(writer, ProcessWriter) else writer._buffers  # type: ignore[attr-defined]
    assert isinstance(buffers, BufferPool)
    return buffers


def make_state(tensors: int = 6, tensor_bytes: int = 4 * MIB) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(7)
    big = {f"t{i}": torch.randn(tensor_bytes // 4, generator=gen) for i in range(tensors)}
    return {"big": StateDict(big), "extra": StateDict({"step": 3, "name": "run"})}


CONFIG = {"memory_budget_bytes": 1 << 30}


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_next_async_take_allocates_nothing_and_restores_bit_exact(tmp_path: Path, executor: str) -> None:
    state = make_state()
    prepared = Snapshot.prepare_async(state, executor=executor, **CONFIG)
    allocated = list(pool(executor).allocated)
    assert prepared == sum(writers.bucket_bytes(_size(b)) for b in allocated) > 0
    pending = Snapshot.async_take(str(tmp_path / "s"), state, executor=executor, **CONFIG)
    snapshot = pending.wait()
    assert pool(executor).allocated == allocated  # same objects, nothing new
    restored = {"big": StateDict({k: torch.zeros_like(v) for k, v in state["big"].items()}), "extra": StateDict()}
    snapshot.restore(restored)
    for key, tensor in state["big"].items():
        assert torch.equal(restored["big"][key], tensor)
    assert dict(restored["extra"]) == {"step": 3, "name": "run"}


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_it_is_idempotent(executor: str) -> None:
    state = make_state()
    assert Snapshot.prepare_async(state, executor=executor, **CONFIG) > 0
    allocated = list(pool(executor).allocated)
    assert Snapshot.prepare_async(state, executor=executor, **CONFIG) == 0
    assert pool(executor).allocated == allocated


def test_buffers_are_faulted_in_and_a_take_after_a_warm_take_needs_no_warm_up(tmp_path: Path) -> None:
    state = make_state()
    Snapshot.async_take(str(tmp_path / "s"), state, **CONFIG).wait()
    assert Snapshot.prepare_async(state, **CONFIG) == 0  # the take's own buffers are back in the pool
    for raw in pool("thread").allocated:
        assert int(raw.sum()) >= 0  # readable (the pages exist)


@pytest.mark.slow
@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_memory_budget_bounds_what_is_prepared(executor: str) -> None:
    state = make_state(tensors=16, tensor_bytes=8 * MIB)  # 128 MiB: two 64 MiB data objects
    # An object larger than the budget is staged alone, but no pool keeps its buffer.
    assert Snapshot.prepare_async(state, executor=executor, memory_budget_bytes=16 * MIB) == 0
    assert Snapshot.prepare_async(state, executor=executor, memory_budget_bytes=64 * MIB) == 64 * MIB
    assert Snapshot.prepare_async(state, executor=executor, **CONFIG) == 64 * MIB  # the second one too now
    assert len(pool(executor).allocated) == 2
    assert staging_budget().pooled_bytes >= 128 * MIB


def _size(buffer: Any) -> int:
    return int(buffer.numel()) if isinstance(buffer, torch.Tensor) else int(buffer.size)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"executor": "fork"}, ConfigError),
        ({"include": "big/*"}, InvalidArgumentError),
        ({"memory_budget_bytes": 0}, ConfigError),
        ({"_custom_tensor_prepare_func": 3}, InvalidArgumentError),
    ],
)
def test_bad_arguments_raise_before_anything_is_allocated(
    kwargs: dict[str, Any], error: type[Exception], fresh_writers: dict[Any, Any]
) -> None:
    with pytest.raises(error):
        Snapshot.prepare_async(make_state(), **kwargs)
    assert not fresh_writers  # no writer made, so no buffer and no daemon


def test_an_invalid_app_state_raises_before_anything_is_allocated(fresh_writers: dict[Any, Any]) -> None:
    with pytest.raises(InvalidAppStateError):
        Snapshot.prepare_async({"x": object()}, executor="process")  # type: ignore[dict-item]
    assert not fresh_writers
