"""SnapshotManager(incremental=True): which saves are full, retention that keeps bases, resuming, ls."""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from snapshotkit import Snapshot, SnapshotManager, StateDict
from snapshotkit._lifecycle.catalog import MANAGER_KEY
from snapshotkit._lifecycle.chains import deletion_order, plan_save, since_full, with_bases
from snapshotkit.cli import main
from snapshotkit.errors import BaseSnapshotError, ConfigError, InvalidArgumentError

FROZEN_BYTES = 256 * 128 * 4  # one frozen piece, above the default min_reference_bytes (64 KiB)


def make_state(seed: int = 0) -> dict[str, Any]:
    """A model whose first half is frozen (its bytes never change, so incremental saves reference
    them) and whose second half changes every step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Linear(128, 64))
    model[0].requires_grad_(False)
    return {"model": model, "progress": StateDict(step=0)}


def train(state: dict[str, Any], step: int) -> None:
    with torch.no_grad():
        state["model"][1].weight.add_(torch.randn(64, 128))
    state["progress"]["step"] = step


def expected(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state["model"].state_dict().items()}


def restores_exactly(path: str, saved: dict[str, torch.Tensor], step: int, options: dict[str, Any]) -> bool:
    fresh = make_state(seed=99)
    Snapshot(path, storage_options=options).restore(fresh)
    got = fresh["model"].state_dict()
    return fresh["progress"]["step"] == step and all(torch.equal(got[k], saved[k]) for k in saved)


def header(mgr: SnapshotManager, step: int) -> tuple[dict[str, str], dict[str, Any]]:
    """The manifest's ``bases`` and the manager's record of ``step``."""
    metadata = mgr.snapshot(step).metadata
    return dict(metadata.bases), dict(metadata.user_metadata[MANAGER_KEY])


def assert_bases_present(mgr: SnapshotManager) -> None:
    """Every base of every committed snapshot is itself committed (retention broke nothing)."""
    steps = mgr.steps()
    for step in steps:
        for location in header(mgr, step)[0]:
            assert int(location.removeprefix("../step_")) in steps, (step, location, steps)


# --------------------------------------------------------------------------- the pure parts


def test_plan_counts_saves_since_the_last_full_one() -> None:
    kinds, newest, count = [], None, 0
    for step in range(1, 8):
        plan = plan_save(newest, count, 3)
        kinds.append(plan.kind)
        newest, count = step, plan.since_full
    assert kinds == ["full", "incremental", "incremental", "full", "incremental", "incremental", "full"]
    assert plan_save(5, 0, 1).kind == "full"
    assert since_full(None) == since_full({"step": 3}) == since_full({"kind": "full", "since_full": 4}) == 0
    assert since_full({"kind": "incremental", "since_full": 2}) == 2
    assert since_full({"kind": "incremental", "since_full": "2"}) == 0


def test_bases_are_kept_and_deleted_after_their_referrers() -> None:
    bases_of = {1: frozenset(), 2: frozenset({1}), 3: frozenset({1}), 5: frozenset({4}), 4: frozenset()}
    assert with_bases({3}, bases_of) == {1, 3}
    assert with_bases({5, 9}, bases_of) == {4, 5, 9}
    assert with_bases({3}, {3: frozenset({2}), 2: frozenset({1})}) == {1, 2, 3}
    order = deletion_order([1, 2, 3], bases_of)
    assert order.index(2) < order.index(1) and order.index(3) < order.index(1)
    assert deletion_order([1, 2], {1: frozenset({2}), 2: frozenset({1})}) == [1, 2]  # a cycle still ends


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"incremental": 1}, InvalidArgumentError),
        ({"incremental": True, "full_every": 2.0}, InvalidArgumentError),
        ({"incremental": True, "full_every": True}, InvalidArgumentError),
        ({"incremental": True, "full_every": 0}, ConfigError),
    ],
)
def test_arguments_are_checked_before_anything_is_written(tmp_path: Path, kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        SnapshotManager(str(tmp_path / "run"), preemption_signals=(), **kwargs)
    assert not (tmp_path / "run").exists()


def test_an_incremental_manager_chooses_the_base_itself(tmp_path: Path) -> None:
    with SnapshotManager(str(tmp_path), incremental=True, preemption_signals=()) as mgr:
        mgr.save(1, make_state())
        with pytest.raises(InvalidArgumentError, match="chooses base="):
            mgr.save(2, make_state(), base=mgr.snapshot_path(1))
        assert mgr.steps() == [1]


# --------------------------------------------------------------------------- saving, retention, resuming


def test_full_every_and_retention_keep_every_kept_snapshot_whole(tmp_path: Path) -> None:
    root = str(tmp_path)
    state, saved = make_state(), {}
    kinds = ["full", "incremental", "incremental", "full", "incremental", "incremental", "full"]
    # after each save (keep_last=2): the newest two, plus what they read from
    steps_after = [[1], [1, 2], [1, 2, 3], [1, 3, 4], [4, 5], [4, 5, 6], [4, 6, 7]]
    mgr = SnapshotManager(root, incremental=True, full_every=3, keep_last=2, preemption_signals=())
    for step in range(1, 8):
        if step == 6:  # a restarted manager continues the count from the newest snapshot's record
            mgr.close()
            mgr = SnapshotManager(root, incremental=True, full_every=3, keep_last=2, preemption_signals=())
        train(state, step)
        mgr.save(step, state)
        saved[step] = expected(state)
        mgr.wait()
        bases, record = header(mgr, step)
        assert record["kind"] == kinds[step - 1], step
        full = max(s for s in range(1, step + 1) if kinds[s - 1] == "full")
        # the frozen half lives in the last full snapshot: references never chain through the previous save
        if full == step:
            assert bases == {}
        else:
            assert bases == {f"../step_{full}": mgr.snapshot(full).metadata.snapshot_id}
            assert record["since_full"] == step - full
        assert mgr.steps() == steps_after[step - 1], step
        assert_bases_present(mgr)
        for kept in mgr.steps():
            assert restores_exactly(mgr.snapshot_path(kept), saved[kept], kept, {}), kept
    mgr.close()
    incremental_bytes = sum(p.stat().st_size for p in (tmp_path / "step_6").rglob("*") if p.is_file())
    full_bytes = sum(p.stat().st_size for p in (tmp_path / "step_7").rglob("*") if p.is_file())
    assert incremental_bytes < full_bytes - FROZEN_BYTES // 2


def test_a_snapshot_without_the_record_counts_as_a_full_base(tmp_path: Path) -> None:
    state = make_state()
    Snapshot.take(str(tmp_path / "step_5"), state)  # taken by hand: no manager record
    with SnapshotManager(str(tmp_path), incremental=True, full_every=2, keep_last=1, preemption_signals=()) as mgr:
        train(state, 6)
        mgr.save(6, state)
        bases, record = header(mgr, 6)
        assert bases == {"../step_5": mgr.snapshot(5).metadata.snapshot_id}
        assert (record["kind"], record["since_full"]) == ("incremental", 1)
        train(state, 7)
        mgr.save(7, state)
        mgr.wait()
        bases, record = header(mgr, 7)
        assert (bases, record["kind"]) == ({}, "full")
        assert mgr.steps() == [5, 7]  # step 6 is dropped; step 5 is not the manager's to delete


def test_a_manager_that_is_not_incremental_writes_full_snapshots(tmp_path: Path) -> None:
    with SnapshotManager(str(tmp_path), preemption_signals=()) as mgr:
        for step in (1, 2):
            mgr.save(step, make_state())
        assert header(mgr, 2)[0] == {}
        assert "kind" not in header(mgr, 2)[1]


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_async_saves_take_against_the_committed_previous_save(tmp_path: Path, executor: str) -> None:
    state, saved = make_state(), {}
    with SnapshotManager(str(tmp_path), incremental=True, full_every=3, keep_last=2, preemption_signals=()) as mgr:
        for step in range(1, 6):
            train(state, step)
            mgr.save(step, state, async_take=True, executor=executor)
            saved[step] = expected(state)
        mgr.wait()
        assert mgr.steps() == [4, 5]
        assert [header(mgr, s)[1]["kind"] for s in mgr.steps()] == ["full", "incremental"]
        assert header(mgr, 5)[0] == {"../step_4": mgr.snapshot(4).metadata.snapshot_id}
        assert_bases_present(mgr)
        for kept in mgr.steps():
            assert restores_exactly(mgr.snapshot_path(kept), saved[kept], kept, {})


def test_restore_latest_skips_a_snapshot_whose_base_is_gone(tmp_path: Path) -> None:
    state, saved = make_state(), {}
    with SnapshotManager(str(tmp_path), incremental=True, full_every=2, preemption_signals=()) as mgr:
        for step in range(1, 5):  # 1 full, 2 -> 1, 3 full, 4 -> 3
            train(state, step)
            mgr.save(step, state)
            saved[step] = expected(state)
    shutil.rmtree(tmp_path / "step_3")  # by hand: step 4 can no longer be read
    with pytest.raises(BaseSnapshotError):
        Snapshot(str(tmp_path / "step_4")).restore(make_state(seed=5))
    fresh = make_state(seed=5)
    warned = pytest.warns(RuntimeWarning, match=r"skipping the snapshot of step 4 .*BaseSnapshotError")
    with SnapshotManager(str(tmp_path), preemption_signals=()) as mgr, warned:
        assert mgr.restore_latest(fresh) == 2
    assert all(torch.equal(fresh["model"].state_dict()[k], saved[2][k]) for k in saved[2])


# --------------------------------------------------------------------------- the command line


def test_ls_and_prune_show_and_keep_the_bases(tmp_path: Path) -> None:
    state = make_state()
    with SnapshotManager(str(tmp_path), incremental=True, full_every=5, preemption_signals=()) as mgr:
        for step in (10, 20, 30):
            train(state, step)
            mgr.save(step, state)
    runner = CliRunner()
    text = runner.invoke(main, ["ls", str(tmp_path)], env={"COLUMNS": "200"}, catch_exceptions=False).stdout
    rows = {line.split("\t")[0]: line.split("\t") for line in text.splitlines()}  # piped: tab-separated rows
    assert rows["10"][4] == "full" and rows["20"][4] == "step 10" and rows["30"][4] == "step 10"
    listed = json.loads(runner.invoke(main, ["ls", str(tmp_path), "--json"], catch_exceptions=False).stdout)
    by_step = {s["step"]: s for s in listed["snapshots"]}
    assert listed["schema"] == "snapshotkit.ls/1"
    assert (by_step[10]["kind"], by_step[10]["bases"]) == ("full", [])
    assert by_step[30]["kind"] == "incremental"
    assert by_step[30]["bases"] == [{"location": "../step_10", "step": 10}]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "step_30").rglob("*") if p.is_file())
    assert by_step[30]["size_bytes"] == on_disk < by_step[10]["size_bytes"] - FROZEN_BYTES // 2

    dry = runner.invoke(main, ["prune", str(tmp_path), "--keep-last", "1", "--dry-run", "--json"])
    assert [s["step"] for s in json.loads(dry.stdout)["deleted"]] == [20]
    pruned = json.loads(runner.invoke(main, ["prune", str(tmp_path), "--keep-last", "1", "--json"]).stdout)
    assert [s["step"] for s in pruned["deleted"]] == [20]
    assert [s["step"] for s in pruned["kept"]] == [10, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10", "step_30"]


# --------------------------------------------------------------------------- s3:// (SeaweedFS)


@pytest.mark.slow
def test_incremental_manager_on_s3(seaweed_s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    bucket = "snapshotkit-incremental"
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):  # another test of this session made it
        client.create_bucket(Bucket=bucket)
    prefix = uuid.uuid4().hex
    options = {"endpoint_url": seaweed_s3_endpoint}
    root = f"s3://{bucket}/{prefix}"
    state, saved = make_state(), {}
    try:
        with SnapshotManager(
            root, incremental=True, full_every=3, keep_last=1, storage_options=options, preemption_signals=()
        ) as mgr:
            for step in range(1, 5):
                train(state, step)
                mgr.save(step, state, async_take=step % 2 == 0)
                saved[step] = expected(state)
                mgr.wait()
            assert mgr.steps() == [4]  # 4 is full: nothing older is needed
        with SnapshotManager(
            root, incremental=True, full_every=3, keep_last=1, storage_options=options, preemption_signals=()
        ) as mgr:
            train(state, 5)
            mgr.save(5, state)
            saved[5] = expected(state)
            mgr.wait()
            mgr_steps = mgr.steps()
            assert header(mgr, 5)[0] == {"../step_4": mgr.snapshot(4).metadata.snapshot_id}
            assert header(mgr, 5)[1]["since_full"] == 1
        assert mgr_steps == [4, 5]
        for kept in mgr_steps:
            assert restores_exactly(f"{root}/step_{kept}", saved[kept], kept, options)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        assert {k.split("/")[1] for k in keys} == {"step_4", "step_5"}
    finally:
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})


def test_a_newest_snapshot_whose_base_is_gone_is_not_taken_against(tmp_path: Path, caplog: Any) -> None:
    state = make_state()
    with SnapshotManager(str(tmp_path), incremental=True, preemption_signals=()) as mgr:
        for step in (1, 2):
            train(state, step)
            mgr.save(step, state)
    shutil.rmtree(tmp_path / "step_1")  # by hand: step 2 can no longer be read, nor serve as a base
    with SnapshotManager(str(tmp_path), incremental=True, preemption_signals=()) as mgr:
        train(state, 3)
        mgr.save(3, state)
        saved = expected(state)
        bases, record = header(mgr, 3)
    assert (bases, record["kind"], record["since_full"]) == ({}, "full", 0)
    assert "gone or replaced: the next save is full" in caplog.text
    assert restores_exactly(str(tmp_path / "step_3"), saved, 3, {})
