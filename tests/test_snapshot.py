"""The facade, ``Snapshot``: take then restore / read_object, checking values bit for bit, for
everything an app_state can hold (dtype by dtype: ``tests/format/test_serialization.py``).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from snapshotkit import RNGState, Snapshot, StateDict
from snapshotkit.manifest import PrimitiveEntry, TensorEntry


def test_non_contiguous_views_and_in_place_strided_destinations(tmp_path: Path) -> None:
    base = torch.arange(60, dtype=torch.float64).reshape(3, 4, 5)
    values = {
        "transposed": base.transpose(0, 2),
        "sliced": base[:, 1:3, ::2],
        "expanded": torch.arange(4.0).expand(3, 4),
        "conj": torch.complex(torch.arange(4.0), torch.ones(4)).conj(),
        "neg": torch.arange(3.0)._neg_view(),
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    for key, value in values.items():
        assert torch.equal(fresh[key], value.resolve_conj().resolve_neg()), key
    # destinations that are themselves strided views receive the values in place
    holder = torch.zeros(5, 4, 3, dtype=torch.float64)
    destination = holder.permute(2, 1, 0)  # shape (3, 4, 5), non-contiguous
    Snapshot(str(tmp_path / "s")).read_object("sd/transposed", obj_out=destination.transpose(0, 2))
    assert torch.equal(holder.permute(2, 1, 0).transpose(0, 2), values["transposed"])


def test_large_tensor_is_chunked_and_strided_read_honours_tiny_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", str(64 << 10))
    monkeypatch.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(256 << 10))
    big = torch.randn(512, 300)  # 600 KiB: ten 64 KiB pieces over three data objects
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(big=big)})
    entry = Snapshot(str(tmp_path / "s")).get_manifest()["0/sd/big"]
    assert isinstance(entry, TensorEntry)
    assert len(entry.pieces) == math.ceil(big.numel() * 4 / (64 << 10))
    assert len({p.location for p in entry.pieces}) >= 3
    out = torch.zeros(300, 512).t()  # strided destination: goes through bounce buffers
    returned = Snapshot(str(tmp_path / "s")).read_object("sd/big", obj_out=out, memory_budget_bytes=10_000)
    assert returned is out
    assert torch.equal(out, big)
    fresh = Snapshot(str(tmp_path / "s")).read_object("sd/big", memory_budget_bytes=4096)
    assert torch.equal(fresh, big)


def test_primitives_are_inline_and_exact(tmp_path: Path) -> None:
    values: dict[str, Any] = {
        "int": -(2**70),
        "float": 0.1,
        "negzero": -0.0,
        "inf": float("-inf"),
        "nan": float("nan"),
        "str": "ünïcode/😀",
        "bool": True,
        "bytes": bytes(range(256)),
        "none": None,
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    manifest = Snapshot(str(tmp_path / "s")).get_manifest()
    for key in values:
        assert isinstance(manifest[f"0/sd/{key}"], PrimitiveEntry)
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    for key, value in values.items():
        if isinstance(value, float):
            assert float.hex(fresh[key]) == float.hex(value)
        else:
            assert fresh[key] == value and type(fresh[key]) is type(value)


def test_containers_and_objects(tmp_path: Path) -> None:
    values = {
        "nested": {"list": [1, (2, 3), {"deep": torch.ones(2)}], 7: "int key"},
        "od": OrderedDict(b=1, a=2),
        "size": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "set": {1, 2, 3},
        "empty": [],
    }
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(values)})
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    assert fresh["nested"]["list"][1] == (2, 3)
    assert torch.equal(fresh["nested"]["list"][2]["deep"], torch.ones(2))
    assert fresh["nested"][7] == "int key"
    assert list(fresh["od"]) == ["b", "a"] and type(fresh["od"]) is OrderedDict
    assert fresh["size"] == torch.Size([2, 3]) and type(fresh["size"]) is torch.Size
    assert fresh["dtype"] is torch.bfloat16
    assert fresh["set"] == {1, 2, 3}
    assert fresh["empty"] == []
    assert Snapshot(str(tmp_path / "s")).read_object("sd/nested/list/1") == (2, 3)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 8),
        torch.nn.Linear(8, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.Linear(8, 10, bias=False),
    )
    model[3].weight = model[0].weight  # tied weights (output head = embedding)
    return model


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        tokens = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(tokens), tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.Adagrad(p, lr=0.1),
    ],
    ids=["sgd", "adam", "adamw", "adagrad"],
)
def test_model_optimizer_scheduler_resume_identically(tmp_path: Path, make_optimizer: Any) -> None:
    model = _model()
    optimizer = make_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    _train(model, optimizer, 3)
    scheduler.step()
    Snapshot.take(str(tmp_path / "s"), {"model": model, "optim": optimizer, "sched": scheduler})
    _train(model, optimizer, 2)
    expected = [p.detach().clone() for p in model.parameters()]

    model2 = _model()
    optimizer2 = make_optimizer(model2.parameters())  # fresh: its state is still empty
    scheduler2 = torch.optim.lr_scheduler.StepLR(optimizer2, step_size=2, gamma=0.5)
    embedding_ptr = model2[0].weight.data_ptr()
    Snapshot(str(tmp_path / "s")).restore({"model": model2, "optim": optimizer2, "sched": scheduler2})
    assert model2[0].weight.data_ptr() == embedding_ptr  # restored in place
    assert model2[3].weight is model2[0].weight  # still tied
    assert scheduler2.state_dict() == scheduler.state_dict() or scheduler2.last_epoch == 1
    _train(model2, optimizer2, 2)
    for a, b in zip(expected, model2.parameters()):
        assert torch.equal(a, b)


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path: Path) -> None:
    model = _model()
    Snapshot.take(str(tmp_path / "s"), {"model": model})
    manifest = Snapshot(str(tmp_path / "s")).get_manifest()
    tied = [manifest["0/model/0.weight"], manifest["0/model/3.weight"]]
    assert isinstance(tied[0], TensorEntry) and isinstance(tied[1], TensorEntry)
    assert tied[0].pieces == tied[1].pieces
    loaded = Snapshot(str(tmp_path / "s")).read_object("model")
    assert loaded["0.weight"] is loaded["3.weight"]


def test_optimizer_whose_state_is_empty_round_trips(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    Snapshot.take(str(tmp_path / "s"), {"optim": optimizer})
    trained = torch.optim.Adam(model.parameters())
    _train(model, trained, 1)
    Snapshot(str(tmp_path / "s")).restore({"optim": trained})
    assert trained.state_dict()["state"] == {}


class _NoisyStateful:
    """A Stateful whose state_dict/load_state_dict draw random numbers (the RNG trap)."""

    def __init__(self) -> None:
        self.value = torch.zeros(2)

    def state_dict(self) -> dict[str, Any]:
        torch.rand(5)
        random.random()
        np.random.rand(3)
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.rand(7)
        random.random()
        np.random.rand(2)
        self.value = state["value"]


def test_rng_state_after_restore_equals_state_after_take(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    app = {"noisy": _NoisyStateful(), "rng": RNGState(), "zz": _NoisyStateful()}
    Snapshot.take(str(tmp_path / "s"), app)
    expected = (torch.rand(4), random.random(), np.random.rand(2), random.gauss(0, 1))
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    Snapshot(str(tmp_path / "s")).restore({"noisy": _NoisyStateful(), "rng": RNGState(), "zz": _NoisyStateful()})
    got = (torch.rand(4), random.random(), np.random.rand(2), random.gauss(0, 1))
    assert torch.equal(expected[0], got[0])
    assert expected[1] == got[1]
    assert np.array_equal(expected[2], got[2])
    assert expected[3] == got[3]


def test_read_object_forms(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    Snapshot.take(str(tmp_path / "s"), {"model": model, "extra": StateDict(step=7)})
    snapshot = Snapshot(str(tmp_path / "s"))
    plain = snapshot.read_object("model/weight")
    prefixed = snapshot.read_object("0/model/weight")
    assert torch.equal(plain, model.weight) and torch.equal(prefixed, model.weight)
    out = torch.empty(2, 3)
    assert snapshot.read_object("model/weight", obj_out=out) is out
    assert torch.equal(out, model.weight)
    assert snapshot.read_object("extra/step") == 7
    whole = snapshot.read_object("model")
    assert set(whole) == {"weight", "bias"}


def test_app_state_keys_with_slashes_and_percent(tmp_path: Path) -> None:
    app = {"a/b": StateDict(x=torch.ones(1)), "50%": StateDict(y=2)}
    Snapshot.take(str(tmp_path / "s"), app)
    assert Snapshot(str(tmp_path / "s")).read_object("a%2Fb/x").item() == 1.0
    fresh = {"a/b": StateDict(), "50%": StateDict()}
    Snapshot(str(tmp_path / "s")).restore(fresh)
    assert fresh["50%"]["y"] == 2


def test_restore_subset_of_keys_reads_only_those(tmp_path: Path) -> None:
    app = {"a": StateDict(t=torch.ones(1000)), "b": StateDict(t=torch.zeros(1000))}
    Snapshot.take(str(tmp_path / "s"), app)
    fresh = {"b": StateDict()}
    Snapshot(str(tmp_path / "s")).restore(fresh)
    assert torch.equal(fresh["b"]["t"], torch.zeros(1000))


def test_memory_scheme_round_trip() -> None:
    app = {"sd": StateDict(t=torch.arange(10), n=3)}
    Snapshot.take("memory://roundtrip-test/one", app)
    fresh = {"sd": StateDict()}
    Snapshot("memory://roundtrip-test/one").restore(fresh)
    assert torch.equal(fresh["sd"]["t"], torch.arange(10)) and fresh["sd"]["n"] == 3


def test_take_returns_snapshot_with_metadata(tmp_path: Path) -> None:
    snapshot = Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(a=1)})
    assert snapshot.metadata.format_version == 5
    assert snapshot.metadata.snapshot_id is not None and len(snapshot.metadata.snapshot_id) == 32
    assert snapshot.metadata.bases == {}
    assert snapshot.metadata.world_size == 1
    assert snapshot.metadata.torch_version == torch.__version__
    assert snapshot.metadata.version == snapshot.metadata.snapshotkit_version


@pytest.mark.parametrize("how", ["take", "async_take-thread", "async_take-process"])
def test_user_metadata_is_stored_and_read_back(tmp_path: Path, how: str) -> None:
    path = str(tmp_path / "s")
    user_metadata = {"step": 1000, "loss": 0.25, "tags": ["lora", "\u00e9"], "eval": {"acc": None, "best": True}}
    app = {"sd": StateDict(a=1)}
    if how == "take":
        snapshot = Snapshot.take(path, app, metadata=user_metadata)
    else:
        snapshot = Snapshot.async_take(path, app, metadata=user_metadata, executor=how.split("-")[1]).wait()
    assert snapshot.metadata.user_metadata == user_metadata
    reopened = Snapshot(path).metadata.user_metadata
    assert reopened == user_metadata
    assert list(reopened) == list(user_metadata)
    assert Snapshot.take(str(tmp_path / "plain"), app).metadata.user_metadata == {}
