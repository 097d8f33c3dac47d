"""Restoring what the snapshot and the destination do not fully share (``snapshotkit._restore.partial``):
the :class:`RestoreReport`, ``strict=False`` merging, and ``strict=True`` naming the keys."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import Net, take_basic
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit import RestoreReport, RNGState, Snapshot, StateDict
from snapshotkit._format.entries import join_path
from snapshotkit._plan.flatten import flatten
from snapshotkit._restore.partial import KeyDifference, _child_containers, compare, merged_state
from snapshotkit.errors import LogicalPathNotFoundError, StateMismatchError

pytestmark = pytest.mark.usefixtures("clean_env")


class LoraNet(torch.nn.Module):
    """A frozen base layer and trainable low-rank adapters (LoRA)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.base = torch.nn.Linear(6, 6)
        self.base_lora_A = torch.nn.Parameter(torch.randn(2, 6, generator=generator))
        self.base_lora_B = torch.nn.Parameter(torch.randn(6, 2, generator=generator))
        self.head = torch.nn.Linear(6, 1)
        with torch.no_grad():
            for parameter in (*self.base.parameters(), *self.head.parameters()):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
                parameter.requires_grad_(False)


def trainable_paths(model: torch.nn.Module, key: str) -> list[str]:
    return sorted(f"{key}/{name}" for name, p in model.named_parameters() if p.requires_grad)


def test_lora_adapters_alone_restore_into_a_fresh_model(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    trained = LoraNet(seed=1)
    Snapshot.take(str(path), {"model": trained}, include=["model/**lora*"])
    assert sorted(k.split("/", 1)[1] for k in Snapshot(str(path)).get_manifest() if k != "0/model") == (
        trainable_paths(trained, "model")
    )

    fresh = LoraNet(seed=2)
    base_before = {k: v.clone() for k, v in fresh.state_dict().items() if "lora" not in k}
    lora_a = fresh.base_lora_A
    report = Snapshot(str(path)).restore({"model": fresh}, strict=False)

    assert torch.equal(fresh.base_lora_A, trained.base_lora_A)
    assert torch.equal(fresh.base_lora_B, trained.base_lora_B)
    assert fresh.base_lora_A is lora_a  # in place
    for name, value in base_before.items():
        assert torch.equal(fresh.state_dict()[name], value), f"{name} changed"
        assert not torch.equal(value, trained.state_dict()[name])
    assert report == RestoreReport(
        missing_keys=("model/base.bias", "model/base.weight", "model/head.bias", "model/head.weight"),
        unexpected_keys=(),
    )


def test_lora_snapshot_into_a_fresh_model_with_strict_names_the_base_weights_and_loads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"model": LoraNet(seed=1)}, include=["model/**lora*"])
    fresh = LoraNet(seed=2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"model": fresh})
    message = str(info.value)
    assert "'model/base.weight'" in message
    assert "'model/head.bias'" in message
    assert "strict=False" in message
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} was loaded by a refused restore"


def _stepped(model: Net, lr: float) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.layer1(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return optimizer


def test_optimizer_state_left_out_keeps_its_current_values(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    model = Net()
    saved = _stepped(model, lr=0.5)
    saved_state = saved.state_dict()["state"]
    Snapshot.take(str(path), {"optim": saved}, exclude=["optim/state/1/**"])  # bias moments left out

    other = Net()
    optimizer = _stepped(other, lr=0.1)
    for _ in range(2):
        optimizer.step()
    current_bias_state = {k: v.clone() for k, v in optimizer.state_dict()["state"][1].items()}
    report = Snapshot(str(path)).restore({"optim": optimizer}, strict=False)

    restored = optimizer.state_dict()
    for name in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(restored["state"][0][name], saved_state[0][name]), name
        assert torch.equal(restored["state"][1][name], current_bias_state[name]), name
    assert restored["param_groups"][0]["lr"] == 0.5
    assert report.missing_keys == ("optim/state/1/exp_avg", "optim/state/1/exp_avg_sq", "optim/state/1/step")
    assert report.unexpected_keys == ()
    optimizer.step()  # still a working optimizer

    with pytest.raises(StateMismatchError, match=r"'optim/state/1/exp_avg'.*strict=False"):
        Snapshot(str(path)).restore({"optim": _stepped(Net(), lr=0.1)})


def test_state_dict_keys_left_out_keep_their_current_values(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(step=3, w=torch.ones(2), name="run")}, include=["extras/step"])
    w = torch.zeros(2)
    extras = StateDict(step=0, w=w, name="fresh", extra=[1, 2])
    report = Snapshot(str(path)).restore({"extras": extras}, strict=False)
    assert dict(extras) == {"step": 3, "w": w, "name": "fresh", "extra": [1, 2]}
    assert extras["w"] is w
    assert torch.count_nonzero(w) == 0
    assert report == RestoreReport(("extras/extra/0", "extras/extra/1", "extras/name", "extras/w"), ())


def test_strict_restore_of_an_object_missing_keys_names_ten_of_each_side(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"sd": StateDict({f"saved{i:02}": i for i in range(12)})})
    destination = StateDict({f"mine{i:02}": -i for i in range(12)})
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"sd": destination})
    message = str(info.value)
    assert "'sd/mine09'" in message
    assert "'sd/mine10'" not in message
    assert "'sd/saved09'" in message
    assert "'sd/saved10'" not in message
    assert "12 key(s)" in message
    assert message.count(" and 2 more") == 2
    assert dict(destination) == {f"mine{i:02}": -i for i in range(12)}  # nothing loaded


def test_unexpected_keys_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)  # model: Net (layer1.weight, layer1.bias); extras: step, w, name, history
    model = torch.nn.Module()
    model.layer1 = torch.nn.Linear(3, 2, bias=False)
    extras = StateDict(step=0, name="")
    report = Snapshot(str(path)).restore({"model": model, "extras": extras}, strict=False)
    assert report.missing_keys == ()
    assert report.unexpected_keys == ("extras/history/0", "extras/history/1", "extras/w", "model/layer1.bias")
    assert torch.equal(model.layer1.weight, Net().layer1.weight)
    assert extras["step"] == 3
    assert torch.equal(extras["w"], torch.arange(8, dtype=torch.float32))  # handed to load_state_dict

    with pytest.raises(StateMismatchError, match=r"'model/layer1\.bias'"):
        Snapshot(str(path)).restore({"model": model})
    # an object other than a module may receive keys it did not have: not a strict mismatch
    assert Snapshot(str(path)).restore({"extras": StateDict(step=0)}).unexpected_keys[0] == "extras/history/0"


def test_an_app_state_key_the_snapshot_lacks_is_skipped_and_reported_without_strict(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    optimizer = torch.optim.SGD(Net().parameters(), lr=0.25, momentum=0.5)
    before = optimizer.state_dict()
    extras = StateDict()
    report = Snapshot(str(path)).restore({"optim": optimizer, "extras": extras}, strict=False)
    assert optimizer.state_dict() == before
    assert extras["step"] == 3
    assert report.unexpected_keys == ()
    assert report.missing_keys == tuple(sorted(report.missing_keys))
    assert "optim/param_groups/0/lr" in report.missing_keys
    assert all(key.startswith("optim/") for key in report.missing_keys)
    with pytest.raises(LogicalPathNotFoundError, match="strict=False"):
        Snapshot(str(path)).restore({"optim": optimizer})


def test_fresh_optimizers_and_empty_state_dicts_take_everything_and_report_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    model = Net()
    Snapshot.take(str(path), {"model": model, "optim": _stepped(model, lr=0.5), "extras": StateDict(a=1, b=[2])})
    for strict in (True, False):
        fresh = Net()
        optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
        extras = StateDict()
        report = Snapshot(str(path)).restore({"model": fresh, "optim": optimizer, "extras": extras}, strict=strict)
        assert report == RestoreReport()
        assert set(optimizer.state_dict()["state"]) == {0, 1}
        assert dict(extras) == {"a": 1, "b": [2]}


def test_lists_are_restored_whole_and_report_nothing_inside(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(history=[0.5, 0.25], pair=(1, {"a": 2}))})
    extras = StateDict(history=[1.0, 2.0, 3.0], pair=(0, {"b": 1}))
    report = Snapshot(str(path)).restore({"extras": extras})
    assert report == RestoreReport()
    assert dict(extras) == {"history": [0.5, 0.25], "pair": (1, {"a": 2})}


def test_rng_state_is_loaded_as_saved_and_reported_only_when_absent(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"rng": RNGState()})
    expected = random.random()
    random.random()
    assert Snapshot(str(path)).restore({"rng": RNGState()}) == RestoreReport()
    assert random.random() == expected

    other = tmp_path / "without-rng"
    Snapshot.take(str(other), {"extras": StateDict(step=1)})
    state = random.getstate()
    report = Snapshot(str(other)).restore({"rng": RNGState(), "extras": StateDict()}, strict=False)
    assert random.getstate() == state
    assert "rng/torch_cpu" in report.missing_keys
    assert all(key.startswith("rng/") for key in report.missing_keys)


def test_report_is_a_frozen_value_of_sorted_tuples(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    report = Snapshot(str(path)).restore({"extras": StateDict(zz=1, aa=2, step=0)}, strict=False)
    assert report.missing_keys == ("extras/aa", "extras/zz")
    assert isinstance(report.unexpected_keys, tuple)
    assert list(report.unexpected_keys) == sorted(report.unexpected_keys)
    with pytest.raises(AttributeError):
        report.missing_keys = ()  # type: ignore[misc]
    _: Any = hash(report)


def test_compare_and_merge_descend_only_through_dicts_both_sides_hold() -> None:
    saved = flatten({"a": {"x": 1}, "seq": [{"p": 1}], "empty": {}, "leaf": 1, "extra": {"s": 2}}, "k")
    current = flatten(
        {"a": {"x": 0, "y": 0}, "seq": [{"p": 0, "q": 0}], "empty": {"z": 0}, "leaf": {"deep": 0}, "new": [5]}, "k"
    )
    difference = compare("k", saved, current, module=False)
    assert difference.missing == ("k/a/y", "k/new/0")
    assert difference.unexpected == ("k/extra/s",)
    merged = merged_state("k", saved, current, difference)
    assert merged == {"a": {"x": 1, "y": 0}, "seq": [{"p": 1}], "empty": {}, "leaf": 1, "extra": {"s": 2}, "new": [5]}
    assert list(merged) == ["a", "seq", "empty", "leaf", "extra", "new"]
    assert compare("k", current, current, module=False) == KeyDifference()


def test_modules_compare_their_leaf_paths_as_sets() -> None:
    saved = flatten({"w": 1, "b": 2}, "m")
    assert compare("m", saved, flatten({}, "m"), module=True).unexpected == ("m/b", "m/w")
    assert compare("m", saved, flatten({}, "m"), module=False) == KeyDifference()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(["a", "b/c", "d%e", "0", "-1", "01"]), st.integers(-2, 3)), unique_by=str),
    st.lists(st.sampled_from(["r/a", "r/b%2Fc", "r/d%25e", "r/0", "r/-1", "r/01", "r/2", "r/a/x", "q/a", "r", "r/z"])),
)
def test_the_child_containers_of_a_dict_are_found_either_way(keys: list[str | int], names: list[str]) -> None:
    containers = dict.fromkeys(names)
    expected = [child for key in keys if (child := join_path("r", key)) in containers]
    assert sorted(_child_containers("r", tuple(keys), containers)) == sorted(
        set(expected)
    )  # keys name distinct children
    padded = tuple(keys) + tuple(f"pad{i}" for i in range(len(containers) + 1))  # more keys than containers
    assert sorted(_child_containers("r", padded, containers)) == sorted(set(expected))
