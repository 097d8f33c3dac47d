"""The CPU-testable part of GPU staging (:mod:`snapshotkit._take.gpu_copy`): which devices a staged
object reads, and that a state on the CPU never pins memory or touches CUDA, even where CUDA is
available. The stream ordering itself is tested on a GPU, in ``tests/gpu/``."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._take import executors
from snapshotkit._take.gpu_copy import GpuCopies, cuda_device_indices, host_buffer

EXECUTORS = ["thread", "process"]
pytestmark = pytest.mark.timeout(120)


def test_the_devices_to_order_are_the_cuda_ones_each_once_sorted() -> None:
    devices = [torch.device("cpu"), torch.device("cuda", 1), torch.device("meta"), torch.device("cuda", 0)]
    assert cuda_device_indices([*devices, torch.device("cuda", 1)]) == (0, 1)
    assert cuda_device_indices([torch.device("cpu")] * 3) == ()
    assert cuda_device_indices([]) == ()


def test_ordering_no_device_makes_no_stream() -> None:
    copies = GpuCopies()
    with copies.ordered(()) as streams:
        assert streams == {}
    assert copies.pinned_bytes == 0


def test_host_buffers_have_pages_of_their_own() -> None:
    buffer = host_buffer(3 << 20)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 3 << 20
    assert buffer.data_ptr() % mmap.PAGESIZE == 0  # pinning it cannot pin a neighbour's page
    buffer[-1] = 7
    assert int(buffer.sum()) == 7


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_cpu_state_pins_nothing_where_cuda_is_available(
    tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CUDA machine training on the CPU: staging must neither pin (page-locked memory is scarce
    # and slow to allocate) nor make CUDA streams. On this CPU-only torch any CUDA call raises.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    values = {"w": torch.randn(300, 200), "strided": torch.randn(64, 32).t(), "step": 3}
    path = str(tmp_path / "s")
    Snapshot.prepare_async({"sd": StateDict(values)}, executor=executor)
    Snapshot.async_take(path, {"sd": StateDict(values)}, executor=executor).wait()
    monkeypatch.undo()
    assert torch.equal(Snapshot(path).read_object("sd/w"), values["w"])
    assert torch.equal(Snapshot(path).read_object("sd/strided"), values["strided"])
    used = [w for w in executors._writers.values() if w.name == executor]
    assert used and all(w._gpu.pinned_bytes == 0 for w in used)  # type: ignore[attr-defined]
