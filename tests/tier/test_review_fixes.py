"""Defects a review found in promotion and in sharded local copies, each fixed, each with the
test that showed it: copies of an abandoned run were kept and promoted (or outranked the new
run's copies in retention), a tensor subclass could not be promoted, DDP state lost its
replication when promoted, a DTensor inside a dict stored as one object came back a plain tensor,
and a sharded module or optimizer skipped the restore's ``strict`` and parameter-group checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from multirank._harness import run_ranks

from snapshotkit import PendingSnapshot, Snapshot, SnapshotManager, StateDict
from snapshotkit._format.entries import TensorEntry


def _promoted(result: Snapshot | PendingSnapshot) -> Snapshot:
    assert isinstance(result, PendingSnapshot)
    return result.wait()


def _manager(tmp: Path | str, durable: str = "durable", node: str = "", **kwargs: Any) -> SnapshotManager:
    options: dict[str, Any] = {
        "save_interval_steps": 2,
        "local_root": f"{tmp}/local{node}",
        "local_interval_steps": 1,
        "preemption_signals": (),
        "async_executor": None,
    }
    return SnapshotManager(f"{tmp}/{durable}", **{**options, **kwargs})


def test_a_leftover_local_copy_is_not_promoted_over_the_state_in_memory(tmp_path: Path) -> None:
    old = _manager(tmp_path, "run1", save_interval_steps=4, local_interval_steps=2)
    old.save(2, {"s": StateDict(w=torch.full((4,), 111.0))}, async_take=True)  # a local copy only
    old.close()
    new = _manager(tmp_path, "run2", local_interval_steps=2)  # a new run, same node-local root, no restore
    state = StateDict(w=torch.full((4,), 2.0))
    promoted = _promoted(new.save(2, {"s": state}, async_take=True))
    new.close()
    assert torch.equal(promoted.read_object("s/w"), state["w"])  # not 111.0, the old run's value


def test_leftover_newer_local_steps_do_not_fail_promotions(tmp_path: Path) -> None:
    old = _manager(tmp_path, "run1", save_interval_steps=100, local_interval_steps=2)
    for step in (8, 10):
        old.save(step, {"s": StateDict(w=torch.ones(4))}, async_take=True)
    old.close()
    new = _manager(tmp_path, "run2", local_interval_steps=2)
    _promoted(new.save(2, {"s": StateDict(w=torch.zeros(4))}, async_take=True))  # was: deleted by retention
    new.close()


class _Sub(torch.Tensor):
    pass


def test_a_tensor_subclass_is_promoted_as_a_take_from_memory_would_be(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    state = StateDict(a=torch.ones(3).as_subclass(_Sub))
    _promoted(mgr.save(2, {"s": state}, async_take=True))  # was: UnsafeObjectError
    mgr.close()


def _ddp(rank: int, world: int, tmp: str) -> list[str]:
    os.environ["SNAPSHOTKIT_NODE_ID"] = "A"
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    mgr = _manager(tmp)
    _promoted(mgr.save(2, {"model": model}, async_take=True))
    mgr.close()
    entries = Snapshot(f"{tmp}/durable/step_2").metadata.manifest
    return sorted(k for k, e in entries.items() if isinstance(e, TensorEntry))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_parameters_stay_replicated_when_promoted(tmp_path: Path) -> None:
    keys = run_ranks(2, _ddp, str(tmp_path))[0]
    assert keys == ["0/model/module.bias", "0/model/module.weight"], keys  # as a take from memory writes


def _fsdp(buffer: bool) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    if buffer:
        model.register_buffer("foo", torch.ones(2))
    fully_shard(model)
    return model


def _sharded_restore(rank: int, world: int, tmp: str, case: str) -> str:
    os.environ["SNAPSHOTKIT_NODE_ID"] = "A"
    model = _fsdp(buffer=case == "strict")
    params = list(model.parameters())
    groups = [{"params": params}]
    optim = torch.optim.AdamW(groups, lr=0.01)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()
    mgr = _manager(tmp, save_interval_steps=100)
    mgr.save(1, {"model": model, "optim": optim}, async_take=True)
    mgr.wait()
    mgr.close()
    model = _fsdp(buffer=False)
    params = list(model.parameters())
    groups = [{"params": params}] if case == "strict" else [{"params": params[:2]}, {"params": params[2:]}]
    optim = torch.optim.AdamW(groups, lr=0.01)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()
    mgr = _manager(tmp, save_interval_steps=100)
    try:
        if case == "strict":
            mgr.restore_latest({"model": model, "optim": optim}, strict=False)
        else:
            mgr.restore_latest({"model": model, "optim": optim})
        return "restored"
    except Exception as exc:
        return f"{type(exc).__module__}.{type(exc).__name__}"
    finally:
        mgr.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sharded_module_restores_from_its_copy_with_strict_false(tmp_path: Path) -> None:
    assert run_ranks(2, _sharded_restore, str(tmp_path), "strict") == ["restored"] * 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sharded_optimizer_with_other_groups_is_refused_with_our_error(tmp_path: Path) -> None:
    assert run_ranks(2, _sharded_restore, str(tmp_path), "groups") == ["snapshotkit.errors.StateMismatchError"] * 2


def _dtensor(world: int, value: float) -> Any:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    return distribute_tensor(torch.arange(24, dtype=torch.float32).reshape(8, 3) + value, mesh, [Shard(0)])


def _tuple_key(rank: int, world: int, tmp: str) -> str:
    os.environ["SNAPSHOTKIT_NODE_ID"] = "A"
    mgr = _manager(tmp, save_interval_steps=100)
    mgr.save(1, {"s": StateDict(d={("a", 1): _dtensor(world, 5.0)})}, async_take=True)
    mgr.wait()
    mgr.close()
    state = StateDict(d={("a", 1): _dtensor(world, -1.0)})
    mgr = _manager(tmp, save_interval_steps=100)
    mgr.restore_latest({"s": state})
    mgr.close()
    return type(state["d"][("a", 1)]).__name__


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_dtensor_under_a_dict_with_tuple_keys_comes_back_a_dtensor(tmp_path: Path) -> None:
    assert run_ranks(2, _tuple_key, str(tmp_path)) == ["DTensor"] * 2


def test_a_resumed_run_removes_only_the_copies_after_its_resume_point(tmp_path: Path) -> None:
    """Resumed from step 4 (step 6's copy damaged), the run's save of step 5 removes the old run's
    step 6 and keeps steps 2 and 4, which are this run's history."""
    old = _manager(tmp_path, save_interval_steps=100, local_interval_steps=2, local_keep_last=3)
    for step in (2, 4, 6):
        old.save(step, {"s": StateDict(w=torch.full((4,), float(step)))})
    old.close()
    data = tmp_path / "local" / "step_6" / "rank_0" / "data"
    victim = next(data.iterdir())
    raw = bytearray(victim.read_bytes())
    raw[0] ^= 0xFF
    victim.write_bytes(bytes(raw))
    new = _manager(tmp_path, save_interval_steps=100, local_interval_steps=1, local_keep_last=3)
    state = StateDict(w=torch.zeros(4))
    with pytest.warns(RuntimeWarning, match="step 6"):
        assert new.restore_latest({"s": state}) == 4
    new.save(5, {"s": state})
    new.wait()
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["step_2", "step_4", "step_5"]
    new.close()
