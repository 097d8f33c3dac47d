"""CUDA paths: GPU tensors are staged to host for writing and filled from host bounce buffers.

These run only where CUDA is available (``tests/gpu/conftest.py``); elsewhere they skip with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import RNGState, Snapshot, StateDict
from snapshotkit.errors import StateMismatchError


def test_cuda_tensors_round_trip_in_place(tmp_path: Path) -> None:
    values = {
        "w": torch.randn(1000, 300, device="cuda"),
        "strided": torch.randn(64, 32, device="cuda").t(),
        "bf16": torch.randn(4096, device="cuda").bfloat16(),
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    destinations = {k: torch.zeros_like(v) for k, v in values.items()}
    pointers = {k: v.data_ptr() for k, v in destinations.items()}
    Snapshot(str(tmp_path / "s")).restore({"sd": StateDict(destinations)}, memory_budget_bytes=64 << 10)
    for key, value in values.items():
        assert destinations[key].is_cuda and destinations[key].data_ptr() == pointers[key]
        assert torch.equal(destinations[key], value)
    fresh = Snapshot(str(tmp_path / "s")).read_object("sd/w")
    assert fresh.device.type == "cpu" and torch.equal(fresh, values["w"].cpu())


def test_cuda_rng_state_round_trips(tmp_path: Path) -> None:
    torch.cuda.init()
    torch.cuda.manual_seed_all(7)
    Snapshot.take(str(tmp_path / "s"), {"rng": RNGState()})
    expected = torch.rand(4, device="cuda")
    Snapshot(str(tmp_path / "s")).restore({"rng": RNGState()})
    assert torch.equal(torch.rand(4, device="cuda"), expected)


def test_cuda_destinations_that_partly_share_memory_are_refused_before_any_read(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(a=torch.randn(4, 6), b=torch.randn(4, 3))})
    flat = torch.zeros(24, device="cuda")
    overlapping = {"a": flat.view(4, 6), "b": flat.view(4, 6)[:, 2:5]}
    with pytest.raises(StateMismatchError, match=r"'sd/a' and 'sd/b' in place: .* partly share memory"):
        Snapshot(str(tmp_path / "s")).restore({"sd": StateDict(overlapping)})
    assert not flat.any()
