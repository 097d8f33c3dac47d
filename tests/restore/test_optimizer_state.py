"""Restoring an optimizer (``snapshotkit._restore.optimizer``): its saved state is checked against
the parameters it belongs to before anything is loaded, so a mismatch is a ``StateMismatchError``
naming the logical path, not a torch error at the next ``optimizer.step()``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import flip_byte, piece_of

from snapshotkit import RestoreReport, Snapshot, SnapshotManager, StateDict
from snapshotkit.errors import StateMismatchError

pytestmark = pytest.mark.usefixtures("clean_env")

MakeOptimizer = Callable[[Any], torch.optim.Optimizer]


def _model(hidden: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))


def _layer(width: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, width))


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 1, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randn(5, 4, generator=generator)

        def closure(batch: torch.Tensor = batch) -> torch.Tensor:  # LBFGS evaluates it several times
            optimizer.zero_grad()
            loss = model(batch).pow(2).mean()
            loss.backward()
            return loss

        optimizer.step(closure)


def _optimizer_state(optimizer: torch.optim.Optimizer) -> dict[Any, dict[str, Any]]:
    return _copy(optimizer.state_dict()["state"])


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(item) for item in value]
    return value


def _assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_same_state(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_state(x, y, f"{where}/{index}")
    else:
        assert a == b, where


def _take(path: Path, make_optimizer: MakeOptimizer, hidden: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model(hidden)
    optimizer = make_optimizer(model.parameters())
    _train(model, optimizer, steps=2)
    Snapshot.take(str(path), {"model": model, "optim": optimizer, "extras": StateDict(w=torch.arange(3.0))})
    return model, optimizer


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01)


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@pytest.mark.parametrize(
    ("make_optimizer", "state_name"), [(_adamw, "exp_avg"), (_sgd, "momentum_buffer")], ids=["adamw", "sgd"]
)
@pytest.mark.parametrize("stepped", [False, True], ids=["fresh", "stepped"])
def test_strict_restore_into_an_optimizer_over_other_shapes_raises_and_changes_nothing(
    tmp_path: Path, make_optimizer: MakeOptimizer, state_name: str, stepped: bool
) -> None:
    path = tmp_path / "snap"
    _take(path, make_optimizer, hidden=3)
    model = _model(hidden=5, seed=7)  # layer 0 is [5, 4] where [3, 4] was saved
    optimizer = make_optimizer(model.parameters())
    if stepped:
        _train(model, optimizer, seed=9)
    extras = StateDict(w=torch.zeros(3))
    state_before = _optimizer_state(optimizer)
    model_before = {name: value.clone() for name, value in model.state_dict().items()}

    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"optim": optimizer, "extras": extras})
    message = str(info.value)
    assert f"'optim/state/0/{state_name}'" in message
    assert "parameter 0 of group 0 has shape [5, 4]" in message
    assert "the snapshot has shape [3, 4]" in message
    assert "strict=False" in message

    _assert_same_state(_optimizer_state(optimizer), state_before)
    for name, value in model.state_dict().items():
        assert torch.equal(value, model_before[name]), name
    assert torch.count_nonzero(extras["w"]) == 0  # planned before the optimizer, not loaded either


def test_the_state_of_a_later_parameter_is_named_by_its_saved_id(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(
        [{"params": [model[0].weight, model[0].bias]}, {"params": list(model[1].parameters()), "lr": 0.5}],
        lr=0.1,
        momentum=0.9,
    )
    _train(model, optimizer)
    Snapshot.take(str(path), {"optim": optimizer})
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 6))  # only group 1 differs
    fresh = torch.optim.SGD(
        [{"params": [other[0].weight, other[0].bias]}, {"params": list(other[1].parameters()), "lr": 0.5}],
        lr=0.1,
        momentum=0.9,
    )
    with pytest.raises(StateMismatchError, match=r"'optim/state/2/momentum_buffer'.*parameter 0 of group 1"):
        Snapshot(str(path)).restore({"optim": fresh})
    assert fresh.state_dict()["state"] == {}


@pytest.mark.parametrize(
    "make_optimizer",
    [
        _adamw,
        _sgd,
        lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
        lambda p: torch.optim.Adagrad(p, lr=0.1),
        lambda p: torch.optim.Rprop(p, lr=0.01),
        lambda p: torch.optim.ASGD(p, lr=0.01),
        lambda p: torch.optim.NAdam(p, lr=0.01),
        pytest.param(
            lambda p: torch.optim.Adafactor(p, lr=0.01),
            marks=pytest.mark.skipif(not hasattr(torch.optim, "Adafactor"), reason="torch.optim.Adafactor is newer"),
        ),
        lambda p: torch.optim.LBFGS(p, lr=0.1),
    ],
    ids=["adamw", "sgd", "adam-amsgrad", "rmsprop", "adagrad", "rprop", "asgd", "nadam", "adafactor", "lbfgs"],
)
def test_matching_restore_loads_the_state_and_steps_on(tmp_path: Path, make_optimizer: MakeOptimizer) -> None:
    # Scalars (step, eta, mu_product), Adafactor's reduced row/column variances and LBFGS's flat
    # buffers are not shaped like their parameter: none of them is refused.
    path = tmp_path / "snap"
    saved_model, saved = _take(path, make_optimizer)
    model = _model(hidden=3, seed=3)
    optimizer = make_optimizer(model.parameters())

    report = Snapshot(str(path)).restore({"model": model, "optim": optimizer})

    assert report == RestoreReport()
    _assert_same_state(_optimizer_state(optimizer), _optimizer_state(saved))
    _train(model, optimizer, seed=5)
    _train(saved_model, saved, seed=5)
    _assert_same_state(_optimizer_state(optimizer), _optimizer_state(saved))


@pytest.mark.parametrize("stepped", [False, True], ids=["fresh", "stepped"])
def test_non_strict_restore_leaves_out_the_state_that_does_not_fit_and_reports_it(
    tmp_path: Path, stepped: bool
) -> None:
    path = tmp_path / "snap"
    _, saved = _take(path, _adamw, hidden=3)
    model = _model(hidden=5, seed=7)  # layers 0 ([5, 4], [5]) and 2's weight ([2, 5]) differ; 2's bias fits
    optimizer = _adamw(model.parameters())
    if stepped:
        _train(model, optimizer, seed=9)
    state_before = _optimizer_state(optimizer)

    report = Snapshot(str(path)).restore({"optim": optimizer}, strict=False)

    assert report.mismatched_keys == tuple(
        f"optim/state/{index}/{name}" for index in range(3) for name in ("exp_avg", "exp_avg_sq", "step")
    )
    expected = _optimizer_state(saved)
    for index in range(3):  # these parameters keep their own state (none for a fresh optimizer)
        if stepped:
            expected[index] = state_before[index]
        else:
            del expected[index]
    assert report.missing_keys == (
        tuple(f"optim/state/{index}/{name}" for index in range(3) for name in ("exp_avg", "exp_avg_sq", "step"))
        if stepped
        else ()
    )
    _assert_same_state(_optimizer_state(optimizer), expected)
    _train(model, optimizer, seed=5)  # a working optimizer


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("change", ["groups", "sizes"])
def test_other_parameter_groups_raise_whatever_strict_says_before_anything_is_loaded(
    tmp_path: Path, strict: bool, change: str
) -> None:
    path = tmp_path / "snap"
    _take(path, _adamw, hidden=3)
    model = _model(hidden=3, seed=7)
    parameters = list(model.parameters())
    if change == "groups":
        optimizer = _adamw([{"params": parameters[:2]}, {"params": parameters[2:]}])
        words = ["'optim/param_groups'", "1 parameter group(s)", "the optimizer 2"]
    else:
        optimizer = _adamw(parameters[:3])
        words = ["'optim/param_groups/0/params'", "has 4 parameter(s)", "the optimizer's 3"]
    model_before = {name: value.clone() for name, value in model.state_dict().items()}

    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"model": model, "optim": optimizer}, strict=strict)
    for word in words:
        assert word in str(info.value)
    for name, value in model.state_dict().items():  # "model" plans first: planned, never loaded
        assert torch.equal(value, model_before[name]), name
    assert optimizer.state_dict()["state"] == {}


def test_optimizers_in_their_own_format_are_not_checked(tmp_path: Path) -> None:
    # A state dict that is not torch's Optimizer.state_dict() format (here a StateDict holding one)
    # is loaded as any other object: nothing maps its ids to parameters.
    path = tmp_path / "snap"
    _, saved = _take(path, _adamw, hidden=3)
    holder = StateDict()
    report = Snapshot(str(path)).restore({"optim": holder})
    assert report == RestoreReport()
    _assert_same_state(holder["state"], _optimizer_state(saved))


def test_restore_latest_refuses_a_fallback_that_left_out_state_a_failed_attempt_wrote(tmp_path: Path) -> None:
    # Step 20's moments of parameter 0 land in the optimizer's own tensors, then fail their
    # checksum; step 10 (saved over a narrower layer) fits none of the parameters, so with
    # strict=False they would keep the damaged bytes the failed attempt left, and no key is
    # missing (the saved state is empty once they are left out): only mismatched_keys tells.
    with SnapshotManager(str(tmp_path), async_executor=None) as mgr:
        for step, width in ((10, 3), (20, 5)):
            model = _layer(width)
            optimizer = _adamw(model.parameters())
            _train(model, optimizer)
            mgr.save(step, {"optim": optimizer})
    data_object, start, _ = piece_of(tmp_path / "step_20", "optim/state/0/exp_avg")
    flip_byte(data_object, start)
    model = _layer(width=5, seed=7)
    optimizer = _adamw(model.parameters())
    _train(model, optimizer, seed=9)
    mgr = SnapshotManager(str(tmp_path), async_executor=None)
    with mgr, pytest.warns(RuntimeWarning, match="step 20"), pytest.raises(StateMismatchError) as info:
        mgr.restore_latest({"optim": optimizer}, strict=False)
    message = str(info.value)
    assert "fell back from step 20 to step 10" in message
    assert "'optim/state/0/exp_avg'" in message
