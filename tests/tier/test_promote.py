"""Promotion in one process: a ``save(async_take=True)`` of a step due on both tiers takes the
durable snapshot from the local copy, in the background. The promoted snapshot must hold what a
take from memory holds (entry for entry, checksum for checksum), an incremental one must write
only what changed, and a damaged copy must never reach the durable tier."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import PendingSnapshot, Snapshot, SnapshotManager, StateDict
from snapshotkit._format.entries import DictEntry, Entry, ListEntry, ObjectEntry, PrimitiveEntry, TensorEntry
from snapshotkit.errors import IntegrityError, InvalidArgumentError, SnapshotNotFoundError

PROMOTED = "promoted to"


def _manager(tmp_path: Path, **kwargs: Any) -> SnapshotManager:
    options: dict[str, Any] = {
        "save_interval_steps": 2,
        "local_root": str(tmp_path / "local"),
        "local_interval_steps": 1,
        "preemption_signals": (),
        "async_executor": None,
    }
    return SnapshotManager(str(tmp_path / "durable"), **{**options, **kwargs})


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # one tensor under two paths

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def _rich_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = _Tied()
    optim = torch.optim.Adam(model.parameters())
    model(torch.arange(4)).sum().backward()
    optim.step()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    loose = StateDict(
        bf16=torch.randn(5, 3).to(torch.bfloat16),
        i64=torch.arange(7),
        flags=torch.tensor([True, False, True]),
        empty=torch.empty(0, 3),
        transposed=base.t(),  # not contiguous: stored contiguous
        complex=torch.randn(4, dtype=torch.complex64),
        fp8=torch.randn(6).to(torch.float8_e4m3fn),
        quantized=torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),  # a torch_save tensor
        scalar=torch.tensor(3.5),
        things={"set": {1, 2}, "tuple": (1, 2.5, "x"), "none": None, "bytes": b"\x00\xff", 7: "int key"},
        ordered=OrderedDict(b=1, a=torch.ones(2)),
        nested=[[torch.zeros(2), 1], {"k/with/slash": torch.full((3,), 2.0)}],
    )
    return {"model": model, "optim": optim, "loose": loose}


def _described(entry: Entry) -> Any:
    if isinstance(entry, TensorEntry):
        return ("tensor", entry.dtype, entry.shape, entry.serializer, [p.checksum for p in entry.pieces])
    if isinstance(entry, ObjectEntry):
        return ("object", entry.obj_type, entry.piece.checksum)
    if isinstance(entry, PrimitiveEntry):
        return ("primitive", entry.value_type, entry.value)
    assert isinstance(entry, (DictEntry, ListEntry))
    return entry


def _ties(manifest: dict[str, Entry]) -> list[list[str]]:
    """Keys whose entries hold the very same bytes (a tensor under several paths)."""
    groups: dict[Any, list[str]] = {}
    for key, entry in manifest.items():
        if isinstance(entry, TensorEntry) and entry.pieces:
            groups.setdefault(tuple((p.location, p.byte_range) for p in entry.pieces), []).append(key)
    return sorted(sorted(keys) for keys in groups.values() if len(keys) > 1)


def test_a_promoted_step_holds_what_a_take_from_memory_holds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = _rich_state()
    mgr = _manager(tmp_path)
    with caplog.at_level(logging.INFO, logger="snapshotkit.manager"):
        pending = mgr.save(2, app, async_take=True)
        assert isinstance(pending, PendingSnapshot)
        promoted = pending.wait()
    assert any(PROMOTED in r.getMessage() for r in caplog.records)
    from_memory = Snapshot.take(str(tmp_path / "memory"), app)
    got, want = promoted.metadata.manifest, from_memory.metadata.manifest
    assert list(got) == list(want)
    assert {k: _described(e) for k, e in got.items()} == {k: _described(e) for k, e in want.items()}
    assert _ties(dict(got)) == _ties(dict(want)) == [["0/model/embed.weight", "0/model/head.weight"]]
    # and it restores like the take from memory
    fresh = _rich_state()
    for stateful in fresh.values():
        if isinstance(stateful, torch.nn.Module):
            torch.nn.init.zeros_(stateful.embed.weight)
    Snapshot(str(tmp_path / "durable" / "step_2")).restore(fresh)
    assert torch.equal(fresh["model"].head.weight, app["model"].head.weight)
    assert fresh["model"].head.weight is fresh["model"].embed.weight
    assert fresh["loose"]["things"] == app["loose"]["things"]
    assert mgr.steps() == [2]
    mgr.close()


def test_an_incremental_promotion_writes_only_the_changed_pieces(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, incremental=True)
    state = StateDict({f"t{i}": torch.full((1 << 18,), 10.0 * i) for i in range(8)})  # 8 x 1 MiB
    for step in (1, 2, 3, 4):
        state["t3"].add_(0.5)  # one tensor in eight changes every step (to values no other holds)
        mgr.save(step, {"s": state}, async_take=True)
    mgr.wait()
    step_4 = mgr.snapshot(4)
    entries = [e for e in step_4.metadata.manifest.values() if isinstance(e, TensorEntry)]
    own = sum(p.nbytes for e in entries for p in e.pieces if p.base is None)
    data = (tmp_path / "durable" / "step_4" / "data").iterdir()
    written = sum(f.stat().st_size for f in data)
    assert own == 1 << 20 and written < 1.1 * (1 << 20)
    restored = StateDict({f"t{i}": torch.zeros(1 << 18) for i in range(8)})
    step_4.restore({"s": restored})
    assert all(torch.equal(restored[k], state[k]) for k in state)
    mgr.close()


def test_a_damaged_local_copy_is_never_promoted(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    state = StateDict(w=torch.arange(1 << 16, dtype=torch.float32))
    assert isinstance(mgr.save(2, {"s": state}, async_take=True), PendingSnapshot)
    mgr.wait()
    tier = mgr._tier
    assert tier is not None
    release = threading.Event()
    tier._pool().submit(release.wait)  # hold the tier's thread: the copy of step 4 waits to be promoted
    state["w"].add_(1.0)
    pending = mgr.save(4, {"s": state}, async_take=True)
    copy = tmp_path / "local" / "step_4" / "rank_0"
    for _ in range(500):
        if (copy / ".snapshot_metadata").is_file():
            break
        threading.Event().wait(0.01)
    data = max((copy / "data").iterdir(), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))  # a bad disk, between the local save and its promotion
    release.set()
    with pytest.raises(IntegrityError, match="not promoted") as caught:
        pending.wait()
    assert "'s/w'" in str(caught.value)
    with pytest.raises(SnapshotNotFoundError):
        _ = Snapshot(str(tmp_path / "durable" / "step_4")).metadata
    with pytest.raises(IntegrityError):
        mgr.wait()  # the failed durable save is raised once more by the manager, then forgotten
    assert mgr.steps() == [2]  # the previous durable step is intact
    restored = StateDict(w=torch.zeros(1 << 16))
    mgr.snapshot(2).restore({"s": restored})
    assert torch.equal(restored["w"], torch.arange(1 << 16, dtype=torch.float32))
    mgr.close()


@pytest.mark.parametrize("case", ["local_promote=False", "sync", "preemption"])
def test_saves_that_are_not_promoted_take_from_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    mgr = _manager(tmp_path, local_promote=case != "local_promote=False")
    state = StateDict(w=torch.ones(8))
    if case == "preemption":
        mgr.request_preemption()
        assert mgr.should_save(1)
    step = 1 if case == "preemption" else 2
    with caplog.at_level(logging.INFO, logger="snapshotkit.manager"):
        mgr.save(step, {"s": state}, async_take=case != "sync")
        mgr.wait()
    assert not any(PROMOTED in r.getMessage() for r in caplog.records)
    assert mgr.steps() == [step]
    mgr.close()


def test_local_promote_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="local_promote"):
        _manager(tmp_path, local_promote="yes")
    assert not (tmp_path / "local").exists()


def test_a_prepare_function_is_applied_once(tmp_path: Path) -> None:
    """``_custom_tensor_prepare_func`` already made the copy's values: the promotion must not apply
    it again (a function that is not idempotent would change the durable step)."""

    def plus_one(path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
        return tensor + 1

    mgr = _manager(tmp_path)
    state = StateDict(w=torch.zeros(1 << 16))
    pending = mgr.save(2, {"s": state}, async_take=True, _custom_tensor_prepare_func=plus_one)
    assert isinstance(pending, PendingSnapshot)
    assert torch.equal(pending.wait().read_object("s/w"), torch.ones(1 << 16))
    mgr.close()


def test_a_promotion_that_never_ran_raises_our_error() -> None:
    import concurrent.futures

    from snapshotkit._tier.promote import PromotionJob
    from snapshotkit.errors import SnapshotkitError

    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.cancel()  # what close(wait=False) does to a promotion still queued
    with pytest.raises(SnapshotkitError, match="never ran"):
        PromotionJob("/x/step_2", future).wait()
