"""SnapshotManager on ``s3://`` (SeaweedFS) and ``gs://`` (fake-gcs-server), and on two gloo ranks."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from multirank._harness import run_ranks

from lifecycle._runs import make_state, same_weights, train_step, weights
from snapshotkit import SnapshotManager, StateDict


def managed_run(root: str, storage_options: dict[str, Any]) -> None:
    state = make_state()
    saved = {}
    with SnapshotManager(root, keep_last=2, storage_options=storage_options) as mgr:
        for step in range(1, 5):
            train_step(state)
            mgr.save(step, state, async_take=step % 2 == 0, metrics={"loss": float(step)})
            saved[step] = weights(state)
        mgr.wait()
        assert mgr.steps() == [3, 4]
        assert mgr.metrics(3) == {"loss": 3.0}
    fresh = make_state(seed=9)
    with SnapshotManager(root, storage_options=storage_options) as mgr:
        assert mgr.restore_latest(fresh) == 4
    assert same_weights(weights(fresh), saved[4])


@pytest.mark.slow
def test_manager_on_s3(seaweed_s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    bucket = "snapshotkit-manager"
    client.create_bucket(Bucket=bucket)
    prefix = uuid.uuid4().hex
    managed_run(f"s3://{bucket}/{prefix}", {"endpoint_url": seaweed_s3_endpoint})
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    assert {k.split("/")[1] for k in keys} == {"step_3", "step_4"}
    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})


@pytest.mark.slow
def test_manager_on_gcs(fake_gcs_endpoint: str) -> None:
    import json
    import urllib.request

    bucket = "snapshotkit-manager"
    request = urllib.request.Request(
        f"{fake_gcs_endpoint}/storage/v1/b",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request).close()
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there
            raise
    managed_run(f"gs://{bucket}/{uuid.uuid4().hex}", {})


# --------------------------------------------------------------------------- two ranks


def _ranks_save_and_resume(rank: int, world_size: int, root: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    state = {"model": model, "local": StateDict(rank=rank, step=0, t=torch.zeros(64))}
    with SnapshotManager(root, keep_last=2, save_interval_steps=2) as mgr:
        for step in range(1, 7):
            with torch.no_grad():
                model.weight.add_(1.0)
            state["local"]["step"] = step
            state["local"]["t"].fill_(step)
            if mgr.should_save(step):
                mgr.save(step, state, replicated=["model/**"], async_take=step == 6)
            if step == 4:
                weight_at_4 = model.weight.detach().clone()
        mgr.wait()
        steps = mgr.steps()
    # damage rank 1's own data of the newest snapshot: rank 0 reads none of it, yet every rank
    # must fall back to the same older snapshot together
    if rank == 1:
        for data in Path(root, "step_6", "data").glob("1_*"):
            data.write_bytes(bytes(b ^ 0xFF for b in data.read_bytes()))
    import torch.distributed as dist

    dist.barrier()
    fresh = {"model": torch.nn.Linear(4, 4), "local": StateDict(rank=-1, step=-1, t=torch.zeros(64))}
    with SnapshotManager(root) as mgr:
        import warnings

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            restored = mgr.restore_latest(fresh)
    return {
        "steps": steps,
        "restored": restored,
        "local": {"rank": fresh["local"]["rank"], "step": fresh["local"]["step"]},
        "t": float(fresh["local"]["t"][0]),
        "weight_is_step_4": torch.equal(fresh["model"].weight.detach(), weight_at_4),
    }


@pytest.mark.slow
def test_two_ranks_agree_on_steps_and_fall_back_together(tmp_path: Path) -> None:
    results = run_ranks(2, _ranks_save_and_resume, str(tmp_path / "run"))
    assert [r["steps"] for r in results] == [[4, 6], [4, 6]]
    assert [r["restored"] for r in results] == [4, 4]
    assert [r["local"] for r in results] == [{"rank": 0, "step": 4}, {"rank": 1, "step": 4}]
    assert [r["t"] for r in results] == [4.0, 4.0]
    assert [r["weight_is_step_4"] for r in results] == [True, True]


def _ranks_one_rank_errs(rank: int, world_size: int, root: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    with SnapshotManager(root, preemption_signals=()) as mgr:
        # a wrong argument on rank 1 only: every rank raises, nothing is written
        try:
            mgr.save(1, {"s": StateDict(rank=rank)}, metrics={"loss": "high" if rank == 1 else 0.5})
        except Exception as exc:
            outcome["save"] = type(exc).__name__
        # a preemption notice requested on rank 0 only, no signals watched: every rank saves
        if rank == 0:
            mgr.request_preemption()
        outcome["should_save"] = mgr.should_save(2)
        if outcome["should_save"]:
            mgr.save(2, {"s": StateDict(rank=rank)})
        mgr.wait()
        outcome["steps"] = mgr.steps()
    return outcome


@pytest.mark.slow
def test_two_ranks_raise_together_and_agree_on_a_one_rank_notice(tmp_path: Path) -> None:
    results = run_ranks(2, _ranks_one_rank_errs, str(tmp_path / "run"))
    assert [r["save"] for r in results] == ["RankFailedError", "ConfigError"]
    assert [r["should_save"] for r in results] == [True, True]
    assert [r["steps"] for r in results] == [[2], [2]]
