"""The inline writer of ``Snapshot.take``: zero-copy staging for contiguous CPU tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._config import Config
from snapshotkit._dist import resolve_group
from snapshotkit._take.prepare import PreparedTake, prepare_take
from snapshotkit._take.writers import InlineWriter
from snapshotkit.storage import url_to_storage_plugin


def _prepare(path: Path, state: StateDict) -> PreparedTake:
    return prepare_take(
        str(path),
        {"sd": state},
        group=resolve_group(None),
        config=Config.resolve(),
        replicated=[],
        open_plugin=lambda where: url_to_storage_plugin(where, {}),
    )


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8).data_ptr() if len(view) else 0


def test_contiguous_cpu_tensors_are_staged_as_views_of_their_own_memory(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.arange(1000, dtype=torch.float32) + i for i in range(3)}
    prepared = _prepare(tmp_path / "s", StateDict(**tensors))
    writer = InlineWriter()
    payloads = prepared.local.payloads
    tensor_addresses = {t.data_ptr() for t in tensors.values()}
    staged_addresses = set()
    for plan in prepared.plan.data_objects:
        assert writer.staging_cost(plan, payloads) == 0
        staged = writer.stage(plan, payloads)
        assert staged.keepalive == ()
        staged_addresses |= {_address(piece) for piece in staged.pieces}
    assert staged_addresses == tensor_addresses


def test_strided_tensors_are_copied_and_counted_against_the_budget(tmp_path: Path) -> None:
    strided = torch.arange(2000, dtype=torch.float32).reshape(40, 50).t()
    prepared = _prepare(tmp_path / "s", StateDict(w=strided))
    writer = InlineWriter()
    payloads = prepared.local.payloads
    (plan,) = prepared.plan.data_objects
    assert writer.staging_cost(plan, payloads) == strided.numel() * strided.element_size()
    staged = writer.stage(plan, payloads)
    assert len(staged.keepalive) == 1
    assert all(_address(piece) != strided.data_ptr() for piece in staged.pieces)
    assert bytes(staged.pieces[0]) == strided.contiguous().numpy().tobytes()


def test_take_writes_the_bytes_the_views_show(tmp_path: Path) -> None:
    # The zero-copy path must still produce the same snapshot as a staged copy would.
    weights = torch.randn(257, 3)
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(w=weights, strided=weights.t())})
    out = Snapshot(str(tmp_path / "s"))
    assert torch.equal(out.read_object("sd/w"), weights)
    assert torch.equal(out.read_object("sd/strided"), weights.t())
