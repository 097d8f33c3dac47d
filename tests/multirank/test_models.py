"""Real distributed models: FSDP2 (``fully_shard``) and ``ShardedTensor`` state, on gloo CPU ranks."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import RestoreReport, Snapshot, StateDict
from snapshotkit.manifest import ShardedTensorEntry

from ._fsdp import fsdp_model, train_step
from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _full(state: dict[str, Any]) -> dict[str, Any]:
    """Every DTensor in a (nested) state dict as its full tensor."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out[key] = _full(value)
        elif hasattr(value, "full_tensor"):
            out[key] = value.full_tensor().clone()
        elif isinstance(value, torch.Tensor):
            out[key] = value.clone()
        else:
            out[key] = value
    return out


def _take_fsdp(rank: int, world: int, path: str) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = fsdp_model(seed=0)
    train_step(model, optim, seed=1 + rank)
    model_sd, optim_sd = get_state_dict(model, optim)
    # DTensors are stored shard by shard whatever the patterns; everything else in these state
    # dicts (step counters, param_groups) is the same on every rank: replicated, so ranks that did
    # not exist at take time get it too.
    Snapshot.take(path, {"model": StateDict(model_sd), "optim": StateDict(optim_sd)}, replicated=["**"])
    return {"model": _full(model_sd), "optim": _full(optim_sd)}


def _restore_fsdp(rank: int, world: int, path: str) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optim = fsdp_model(seed=42)  # different weights, and a first step to create optimizer state
    train_step(model, optim, seed=7)
    model_sd, optim_sd = get_state_dict(model, optim)
    app_state = {"model": StateDict(model_sd), "optim": StateDict(optim_sd)}
    Snapshot(path).restore(app_state)
    set_state_dict(model, optim, model_state_dict=dict(app_state["model"]), optim_state_dict=dict(app_state["optim"]))
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": _full(model_sd), "optim": _full(optim_sd)}


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize(("saved", "restored"), [(2, 2), (4, 2), (2, 4)])
def test_fsdp2_model_and_optimizer(tmp_path: Path, saved: int, restored: int) -> None:
    path = str(tmp_path / "snap")
    taken = run_ranks(saved, _take_fsdp, path)
    manifest = Snapshot(path).get_manifest()
    assert isinstance(manifest["0/model/0.weight"], ShardedTensorEntry)
    assert isinstance(manifest["0/optim/state/0.weight/exp_avg"], ShardedTensorEntry)
    restored_states = run_ranks(restored, _restore_fsdp, path)
    for state in restored_states:
        _assert_same(state["model"], taken[0]["model"], "model")
        _assert_same(state["optim"]["state"], taken[0]["optim"]["state"], "optim")


def _sharded_tensor(rank: int, world: int, path: str) -> bool:
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ShardedTensor is deprecated in favour of DTensor
        spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
        saved = sharded_tensor.empty(spec, 10, 6)
        for shard in saved.local_shards():
            offset = shard.metadata.shard_offsets[0]
            rows = shard.tensor.shape[0]
            shard.tensor.copy_(torch.arange(offset * 6, (offset + rows) * 6, dtype=torch.float32).reshape(rows, 6))
        Snapshot.take(path, {"s": StateDict(w=saved)})
        column_spec = ChunkShardingSpec(dim=1, placements=[f"rank:{r}/cpu" for r in range(world)])
        target = sharded_tensor.zeros(column_spec, 10, 6)
        Snapshot(path).restore({"s": StateDict(w=target)})
        full = torch.arange(60, dtype=torch.float32).reshape(10, 6)
        for shard in target.local_shards():
            rows, cols = shard.metadata.shard_offsets
            height, width = shard.metadata.shard_sizes
            assert torch.equal(shard.tensor, full[rows : rows + height, cols : cols + width])
    return torch.equal(Snapshot(path).read_object("s/w"), full)


def test_sharded_tensor_reshards_row_to_column(tmp_path: Path) -> None:
    assert run_ranks(3, _sharded_tensor, str(tmp_path / "snap")) == [True, True, True]


def _fsdp_optimizer_direct(rank: int, world: int, path: str) -> dict[str, Any]:
    """An FSDP2 optimizer passed to take and restore as it is: its state tensors are DTensors shaped
    (globally) like their DTensor parameters, checked against them on restore."""
    from torch.distributed.fsdp import fully_shard

    from snapshotkit.errors import StateMismatchError

    model, optim = fsdp_model(seed=0)
    train_step(model, optim, seed=1)
    Snapshot.take(path, {"model": model, "optim": optim})
    saved = _full(torch.optim.Optimizer.state_dict(optim)["state"])

    same, same_optim = fsdp_model(seed=42)
    train_step(same, same_optim, seed=7)  # DTensor state to restore into
    report = Snapshot(path).restore({"model": same, "optim": same_optim})
    restored = _full(torch.optim.Optimizer.state_dict(same_optim)["state"])
    train_step(same, same_optim, seed=8)  # still a working optimizer

    torch.manual_seed(3)
    wider = torch.nn.Sequential(torch.nn.Linear(16, 35), torch.nn.ReLU(), torch.nn.Linear(35, 5))
    for layer in wider:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(wider)
    wider_optim = torch.optim.AdamW(wider.parameters(), lr=0.01)
    try:
        Snapshot(path).restore({"optim": wider_optim})
    except StateMismatchError as exc:
        message = str(exc)
    else:
        message = "restored"
    return {
        "report": report,
        "saved": saved,
        "restored": restored,
        "message": message,
        "wider_state": dict(wider_optim.state),
    }


def test_fsdp2_optimizer_state_is_checked_against_global_parameter_shapes(tmp_path: Path) -> None:
    results = run_ranks(2, _fsdp_optimizer_direct, str(tmp_path / "snap"))
    for result in results:
        assert result["report"] == RestoreReport()
        _assert_same(result["restored"], result["saved"], "optim")
        message = result["message"]
        assert "'optim/state/0/exp_avg'" in message
        assert "has shape [35, 16]" in message  # global shapes, not the local shards'
        assert "the snapshot has shape [33, 16]" in message
        assert result["wider_state"] == {}


def _fsdp_fresh_optimizer(rank: int, world: int, path: str) -> dict[str, Any]:
    """A resumed FSDP2 run builds a fresh optimizer (no state yet) and restores into it: its moments
    come back as DTensors laid out like their parameters, and it trains on."""
    model, optim = fsdp_model(seed=0)
    train_step(model, optim, seed=1)
    Snapshot.take(path, {"model": model, "optim": optim})
    saved = _full(torch.optim.Optimizer.state_dict(optim)["state"])

    fresh, fresh_optim = fsdp_model(seed=42)
    assert not fresh_optim.state
    report = Snapshot(path).restore({"model": fresh, "optim": fresh_optim})
    state = torch.optim.Optimizer.state_dict(fresh_optim)["state"]
    kinds = sorted({type(v).__name__ for s in state.values() for k, v in s.items() if k != "step"})
    restored = _full(state)
    train_step(fresh, fresh_optim, seed=8)  # was: "mixed torch.Tensor and DTensor" (full plain moments)
    return {"report": report, "saved": saved, "restored": restored, "kinds": kinds}


def test_a_fresh_fsdp2_optimizer_gets_dtensor_state_back(tmp_path: Path) -> None:
    for result in run_ranks(2, _fsdp_fresh_optimizer, str(tmp_path / "snap")):
        assert result["report"] == RestoreReport()
        assert result["kinds"] == ["DTensor"]
        _assert_same(result["restored"], result["saved"], "optim")
