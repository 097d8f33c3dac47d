"""GPU staging is ordered after the kernels that produce the tensors (:mod:`snapshotkit._take.gpu_copy`).

Each test queues a long kernel (``torch.cuda._sleep``) and then the kernel that writes the final
values, and calls ``async_take`` at once, while both are still queued: the stored values must be
the final ones. Before the fix the side stream did not wait for the caller's stream, so the copy
ran during the sleep and stored the old values under a valid checksum.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._take import executors

EXECUTORS = ["thread", "process"]
NUMEL = 4 << 20  # 16 MiB of float32: several pieces
#: GPU clock cycles of the long kernel: a few hundred milliseconds on current GPUs, far longer
#: than staging takes to start a copy.
SLEEP_CYCLES = 1_000_000_000
pytestmark = pytest.mark.timeout(300)


def _late(specs: dict[str, tuple[int, int, torch.dtype]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Tensors of zeros (``name -> (device index, numel, dtype)``) whose final values (returned, on
    the CPU) kernels queued behind a long one on each device's current stream write."""
    values, finals, expected = {}, {}, {}
    for name, (index, numel, dtype) in specs.items():
        finals[name] = torch.randn(numel, device=f"cuda:{index}", dtype=dtype)
        values[name] = torch.zeros_like(finals[name])
        expected[name] = finals[name].cpu()  # before the sleep: a copy to the CPU would wait for it
    devices = sorted({index for index, _, _ in specs.values()})
    for index in devices:
        torch.cuda.synchronize(index)
    for index in devices:
        with torch.cuda.device(index):
            torch.cuda._sleep(SLEEP_CYCLES)
    for name, value in values.items():
        value.copy_(finals[name])  # on its device's current stream, behind the sleep
    return values, expected


def _stored(path: str, key: str) -> torch.Tensor:
    return Snapshot(path).read_object(f"sd/{key}")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_copy_waits_for_kernels_queued_on_the_current_stream(tmp_path: Path, executor: str) -> None:
    values, expected = _late({"x": (0, NUMEL, torch.float32)})
    path = str(tmp_path / "s")
    pending = Snapshot.async_take(path, {"sd": StateDict(values)}, executor=executor)
    values["x"].fill_(-1.0)  # after async_take returned: not in the snapshot
    pending.wait()
    assert torch.equal(_stored(path, "x"), expected["x"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_copy_waits_for_the_callers_own_stream(tmp_path: Path, executor: str) -> None:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        values, expected = _late({"x": (0, NUMEL, torch.float32)})
        path = str(tmp_path / "s")
        Snapshot.async_take(path, {"sd": StateDict(values)}, executor=executor).wait()
    assert torch.equal(_stored(path, "x"), expected["x"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_views_and_lazy_conjugates_are_copied_after_the_producer(tmp_path: Path, executor: str) -> None:
    values, expected = _late({"real": (0, 1 << 20, torch.float32), "complex": (0, 1 << 20, torch.complex64)})
    matrix, final_matrix = values["real"].view(1024, 1024), expected["real"].view(1024, 1024)
    path = str(tmp_path / "s")
    state = {
        "t": matrix.t(),
        "rows": matrix[::3],
        "conj": values["complex"].conj(),
        "neg": torch._neg_view(values["real"]),
    }
    Snapshot.async_take(path, {"sd": StateDict(state)}, executor=executor).wait()
    assert torch.equal(_stored(path, "t"), final_matrix.t())
    assert torch.equal(_stored(path, "rows"), final_matrix[::3])
    assert torch.equal(_stored(path, "conj"), expected["complex"].conj().resolve_conj())
    assert torch.equal(_stored(path, "neg"), -expected["real"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_staging_buffers_are_pinned_only_for_gpu_state(
    tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pinned_bytes() -> int:
        return sum(w._gpu.pinned_bytes for w in executors._writers.values() if w.name == executor)  # type: ignore[attr-defined]

    # One 90 MiB data object: a 128 MiB bucket, which no other test's data objects (64 MiB at most) use.
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(100 << 20))
    numel = 90 << 18
    cpu_state = {"x": torch.randn(numel)}
    Snapshot.async_take(str(tmp_path / "cpu"), {"sd": StateDict(cpu_state)}, executor=executor).wait()
    before = pinned_bytes()
    Snapshot.async_take(str(tmp_path / "cpu2"), {"sd": StateDict(cpu_state)}, executor=executor).wait()
    assert pinned_bytes() == before  # a CPU state pins nothing
    gpu_state = {"x": cpu_state["x"].cuda()}
    Snapshot.async_take(str(tmp_path / "gpu"), {"sd": StateDict(gpu_state)}, executor=executor).wait()
    assert pinned_bytes() == before + (128 << 20)
    assert torch.equal(_stored(str(tmp_path / "gpu"), "x"), cpu_state["x"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_prepare_async_pins_the_buffers_of_a_gpu_state(executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def pinned_bytes() -> int:
        return sum(w._gpu.pinned_bytes for w in executors._writers.values() if w.name == executor)  # type: ignore[attr-defined]

    before = pinned_bytes()
    # One 150 MiB data object: a 256 MiB bucket, which no other test's data objects (64 MiB at most) use.
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(160 << 20))
    made = Snapshot.prepare_async({"sd": StateDict(x=torch.zeros(150 << 18, device="cuda"))}, executor=executor)
    assert made == 256 << 20
    assert pinned_bytes() >= before + made


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("current", [0, 1])
def test_each_device_is_copied_on_its_own_side_stream(tmp_path: Path, executor: str, current: int) -> None:
    # Before: one side stream, on the device current at first use; a tensor on another device was
    # copied on that device's own stream, and staging waited only for the side stream.
    values, expected = _late({"d0": (0, NUMEL, torch.float32), "d1": (1, NUMEL, torch.float32)})
    path = str(tmp_path / "s")
    with torch.cuda.device(current):
        Snapshot.async_take(path, {"sd": StateDict(values)}, executor=executor).wait()
    for key, final in expected.items():
        assert torch.equal(_stored(path, key), final), key


@pytest.mark.parametrize("own_stream", [False, True])
def test_restore_fills_after_the_callers_queued_kernels(tmp_path: Path, own_stream: bool) -> None:
    # Reads fill GPU destinations from worker threads (the device's default stream); before the
    # fix, a kernel still queued on the caller's own stream wrote its stale values afterwards.
    stored = torch.randn(NUMEL)
    path = str(tmp_path / "s")
    Snapshot.take(path, {"sd": StateDict(x=stored)})
    destination = torch.zeros(NUMEL, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream() if own_stream else None):
        torch.cuda._sleep(SLEEP_CYCLES)
        destination.fill_(5.0)  # queued before the restore: overwritten by it
        Snapshot(path).restore({"sd": StateDict(x=destination)})
        destination.add_(1.0)  # queued after: sees the restored values
        assert torch.equal(destination.cpu(), stored + 1.0)
