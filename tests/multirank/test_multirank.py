"""Multi-rank takes and restores on real gloo process groups (2, 3 and 4 forked ranks)."""

from __future__ import annotations

import glob
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import (
    CollectiveTimeoutError,
    LogicalPathNotFoundError,
    RankFailedError,
    SnapshotNotFoundError,
    StorageError,
)
from snapshotkit.manifest import ShardedTensorEntry, TensorEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, rank: int) -> None:
    torch.manual_seed(100 + rank)  # different data on every rank; DDP averages the gradients
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()


def _snapshot_of(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optim": torch.optim.Optimizer.state_dict(optim)["state"],
    }


def _data_objects(path: str) -> dict[str, int]:
    return {os.path.relpath(p, path): os.path.getsize(p) for p in glob.glob(f"{path}/data/*")}


# ------------------------------------------------------------------ DDP + optimizer


def _ddp_round_trip(rank: int, world: int, path: str) -> dict[str, Any]:
    model = DistributedDataParallel(_model())
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train_step(model, optim, rank)
    progress = StateDict(step=7, rank_tag=f"rank-{rank}", local=torch.full((3,), float(rank)))
    app_state = {"model": model, "optim": optim, "progress": progress}
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optim = {k: {n: t.clone() for n, t in s.items()} for k, s in optim.state_dict()["state"].items()}
    Snapshot.take(path, app_state, replicated=["optim/**"])

    _train_step(model, optim, rank)  # move away from the snapshot
    progress["rank_tag"] = "changed"
    progress["local"].zero_()
    Snapshot(path).restore(app_state)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    for index, state in optim.state_dict()["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, saved_optim[index][name]), (index, name)
    assert progress["rank_tag"] == f"rank-{rank}"
    assert torch.equal(progress["local"], torch.full((3,), float(rank)))
    return {"manifest_keys": sorted(Snapshot(path).get_manifest())}


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_and_optimizer_round_trip(tmp_path: Path, world: int) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(world, _ddp_round_trip, path)
    manifest = Snapshot(path).get_manifest()
    assert results[0]["manifest_keys"] == sorted(manifest)
    # DDP's parameters are inferred replicated and stored once (under rank 0); optim/** was asked for.
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        entry = manifest[f"0/model/module.{name}"]
        assert isinstance(entry, TensorEntry) and entry.replicated
        assert not any(k == f"{r}/model/module.{name}" for r in range(1, world) for k in manifest)
    assert all(e.replicated for k, e in manifest.items() if k.startswith("0/optim/state/") and hasattr(e, "replicated"))
    # rank-local state is stored per rank
    for rank in range(world):
        assert manifest[f"{rank}/progress/rank_tag"].value == f"rank-{rank}"  # type: ignore[union-attr]
        assert isinstance(manifest[f"{rank}/progress/local"], TensorEntry)
    # every data object was written by exactly one rank (its name carries the rank), and every
    # piece the manifest names lies inside an object that exists
    objects = _data_objects(path)
    for location in objects:
        assert location.split("/")[1].split("_")[0].isdigit()
    for entry in manifest.values():
        for piece in getattr(entry, "pieces", ()):
            assert piece.location in objects and piece.byte_range[1] <= objects[piece.location]


def _spread_large_replicated(rank: int, world: int, path: str) -> None:
    # One 8 MiB replicated tensor, in 1 MiB pieces, must be spread over all ranks.
    state = StateDict(big=torch.arange(2 * 1024 * 1024, dtype=torch.float32))
    Snapshot.take(path, {"state": state}, replicated=["**"])


def test_one_big_replicated_tensor_is_spread_over_ranks(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    run_ranks(4, _spread_large_replicated, path, env={"SNAPSHOTKIT_CHUNK_BYTES": str(1 << 20)})
    by_rank: dict[str, int] = {}
    for location, size in _data_objects(path).items():
        writer = location.split("/")[1].split("_")[0]
        by_rank[writer] = by_rank.get(writer, 0) + size
    assert sorted(by_rank) == ["0", "1", "2", "3"]
    assert all(size == 2 << 20 for size in by_rank.values()), by_rank
    value = Snapshot(path).read_object("state/big")
    assert torch.equal(value, torch.arange(2 * 1024 * 1024, dtype=torch.float32))


# ------------------------------------------------------------------ glob semantics


def _globs(rank: int, world: int, path: str) -> str:
    import warnings

    state = StateDict(shared=torch.ones(4), extra=torch.ones(2), note="same", differs=torch.ones(2 + rank))
    if rank == 0:
        state["only_on_zero"] = torch.zeros(2)
        patterns = ["state/shared", "state/extra", "state/note", "state/only_on_zero", "state/differs"]
    else:
        patterns = ["state/shared", "state/note", "state/differs"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Snapshot.take(path, {"state": state}, replicated=patterns)
    return "; ".join(str(w.message) for w in caught)


def test_glob_patterns_count_only_if_every_rank_passes_them(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    warned = run_ranks(2, _globs, path)
    manifest = Snapshot(path).get_manifest()
    assert manifest["0/state/shared"].replicated and "1/state/shared" not in manifest  # type: ignore[union-attr]
    assert manifest["0/state/note"].replicated  # type: ignore[union-attr]
    # rank 1 did not pass state/extra: stored per rank, not replicated
    assert not manifest["0/state/extra"].replicated and "1/state/extra" in manifest  # type: ignore[union-attr]
    # exists on rank 0 only: never replicated
    assert not manifest["0/state/only_on_zero"].replicated  # type: ignore[union-attr]
    # different shapes: stored per rank, and rank 0 says so
    assert manifest["0/state/differs"].shape == (2,) and manifest["1/state/differs"].shape == (3,)  # type: ignore[union-attr]
    assert "'state/differs' (ranks [1])" in warned[0] and "stored per rank" in warned[0]


# ------------------------------------------------------------------ elasticity: 3 -> 4, 4 -> 2


def _take_elastic(rank: int, world: int, path: str) -> None:
    model = DistributedDataParallel(_model(seed=3))
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(12 * 10, dtype=torch.float32).reshape(12, 10)
    table = distribute_tensor(full, mesh, [Shard(0)])
    app_state = {"model": model, "table": StateDict(w=table), "progress": StateDict(step=rank * 10)}
    Snapshot.take(path, app_state)


def _restore_elastic(rank: int, world: int, path: str, saved_world: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    model = DistributedDataParallel(_model(seed=99))
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    table = distribute_tensor(torch.zeros(12, 10), mesh, [Shard(1)])
    app_state: dict[str, Any] = {"model": model, "table": StateDict(w=table)}
    if rank < saved_world:
        app_state["progress"] = StateDict(step=-1)
    Snapshot(path).restore(app_state)
    expected = _model(seed=3).state_dict()
    for name, tensor in model.module.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert torch.equal(table.full_tensor(), torch.arange(12 * 10, dtype=torch.float32).reshape(12, 10))
    if rank < saved_world:
        assert app_state["progress"]["step"] == rank * 10
    # a new rank asking for per-rank state it never had gets a clear error, on every rank
    error = ""
    try:
        Snapshot(path).restore({"progress": StateDict(step=-1)})
    except (LogicalPathNotFoundError, RankFailedError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error}


@pytest.mark.parametrize(("saved", "restored"), [(3, 4), (4, 2)])
def test_restore_onto_a_different_world_size(tmp_path: Path, saved: int, restored: int) -> None:
    path = str(tmp_path / "snap")
    run_ranks(saved, _take_elastic, path)
    results = run_ranks(restored, _restore_elastic, path, saved)
    if restored > saved:
        new_rank = results[restored - 1]["error"]
        assert new_rank.startswith("AppStateKeyNotFoundError")  # a LogicalPathNotFoundError
        assert "did not exist then" in new_rank and "replicated=" in new_rank
        assert results[0]["error"].startswith("RankFailedError") and f"rank {saved}" in results[0]["error"]
    else:
        assert all(r["error"] == "" for r in results)


# ------------------------------------------------------------------ DTensor resharding matrix


def _placements(mesh_ndim: int) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    if mesh_ndim == 1:
        return [[Shard(0)], [Shard(1)], [Replicate()]]
    return [
        [Shard(0), Shard(1)],
        [Shard(1), Shard(0)],
        [Replicate(), Shard(0)],
        [Shard(0), Replicate()],
        [Replicate(), Replicate()],
        [Shard(0), Shard(0)],
    ]


def _matrix(rank: int, world: int, root: str, mesh_shape: tuple[int, ...]) -> int:
    from torch.distributed.tensor import distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", mesh_shape)
    full = torch.arange(9 * 7, dtype=torch.float64).reshape(9, 7)  # uneven on every mesh dim
    checked = 0
    for i, source in enumerate(_placements(len(mesh_shape))):
        path = f"{root}/{i}"
        Snapshot.take(path, {"t": StateDict(w=distribute_tensor(full, mesh, source))})
        entry = Snapshot(path).get_manifest()["0/t/w"]
        assert isinstance(entry, ShardedTensorEntry)
        assert sum(len(s.pieces) for s in entry.shards) >= 1
        for target in _placements(len(mesh_shape)):
            destination = distribute_tensor(torch.zeros(9, 7, dtype=torch.float64), mesh, target)
            Snapshot(path).restore({"t": StateDict(w=destination)})
            assert torch.equal(destination.full_tensor(), full), (source, target)
            checked += 1
        assert torch.equal(Snapshot(path).read_object("t/w"), full)  # no obj_out: the whole tensor
        local = distribute_tensor(torch.zeros(9, 7, dtype=torch.float64), mesh, source)
        Snapshot(path).read_object("t/w", obj_out=local)
        assert torch.equal(local.full_tensor(), full)
    return checked


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)])
def test_dtensor_resharding_matrix(tmp_path: Path, mesh_shape: tuple[int, ...]) -> None:
    results = run_ranks(4, _matrix, str(tmp_path), mesh_shape)
    count = len(_placements(len(mesh_shape)))
    assert results == [count * count] * 4
    # replicated DTensor shards were written once: no two shards of one entry share a box
    for i in range(count):
        entry = Snapshot(str(tmp_path / str(i))).get_manifest()["0/t/w"]
        assert isinstance(entry, ShardedTensorEntry)
        boxes = [(s.offsets, s.sizes) for s in entry.shards]
        assert len(boxes) == len(set(boxes))


# ------------------------------------------------------------------ faults: nobody hangs


def _different_keys(rank: int, world: int, path: str) -> list[str]:
    app_state: dict[str, Any] = {"common": StateDict(x=torch.ones(2))}
    if rank == 1:
        app_state["only_one"] = StateDict(y=torch.zeros(3))
    Snapshot.take(path, app_state)
    Snapshot(path).restore(app_state)
    return sorted(k for k in Snapshot(path).get_manifest())


def test_different_app_state_keys_do_not_hang(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(2, _different_keys, path, timeout=60)
    assert "1/only_one/y" in results[0] and "0/only_one" not in results[0]


class _Exploding:
    def state_dict(self) -> dict[str, Any]:
        raise ValueError("state_dict exploded on purpose")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise AssertionError("unreachable")


def _failing_state_dict(rank: int, world: int, path: str) -> str:
    app_state: dict[str, Any] = {"ok": StateDict(x=torch.ones(1024))}
    if rank == 1:
        app_state["bad"] = _Exploding()
    started = time.monotonic()
    try:
        Snapshot.take(path, app_state)
    except Exception as exc:
        assert time.monotonic() - started < 10
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_rank_raising_in_state_dict_fails_every_rank(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(3, _failing_state_dict, path, timeout=60)
    assert results[1] == "ValueError: state_dict exploded on purpose"
    for rank in (0, 2):
        assert results[rank].startswith("RankFailedError: take: describing each rank's state: rank 1 failed")
        assert "state_dict exploded on purpose" in results[rank]
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(path).metadata
    assert _data_objects(path) == {}


def _failing_write(rank: int, world: int, path: str) -> str:
    from snapshotkit.storage import FSStoragePlugin, register_storage_plugin

    class FailOnRankOne(FSStoragePlugin):
        async def write(self, location: str, data: Any) -> None:
            if rank == 1 and location.startswith("data/"):
                raise OSError(28, "No space left on device (injected)")
            await super().write(location, data)

    register_storage_plugin("failing", lambda root, options: FailOnRankOne(root))
    try:
        Snapshot.take(f"failing://{path}", {"s": StateDict(x=torch.ones(100_000) * rank)})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_failed_write_on_one_rank_fails_every_rank_and_leaves_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(3, _failing_write, path, timeout=60)
    assert results[1].startswith("StorageError") and "No space left" in results[1]
    for rank in (0, 2):
        assert results[rank].startswith("RankFailedError: take: writing the data objects: rank 1 failed")
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(path).metadata
    assert _data_objects(path) == {}  # every rank deleted what it wrote
    assert issubclass(RankFailedError, RuntimeError) and issubclass(StorageError, OSError)


def _absent_rank(rank: int, world: int, path: str) -> str:
    if rank == 1:
        time.sleep(6)  # never calls take
        return "absent"
    started = time.monotonic()
    try:
        Snapshot.take(path, {"s": StateDict(x=1)})
    except CollectiveTimeoutError as exc:
        return f"{time.monotonic() - started:.1f} {exc}"
    return "no error"


def test_collectives_time_out_with_an_error_naming_the_step(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    results = run_ranks(2, _absent_rank, path, timeout=60, env={"SNAPSHOTKIT_COLLECTIVE_TIMEOUT_SECONDS": "2"})
    seconds, _, message = results[0].partition(" ")
    assert float(seconds) < 5, results[0]
    assert message.startswith("take: agreeing whether the last plan holds: rank 0 of 2 waited 2 s"), message
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(path).metadata


# ------------------------------------------------------------------ sub-groups and paths


def _subgroup(rank: int, world: int, root: str) -> str:
    group = dist.new_group([0, 2])
    if rank in (0, 2):
        path = f"{root}/from-rank-{rank}"  # different paths: rank 0's wins, with a warning
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            taken = Snapshot.take(path, {"s": StateDict(rank=rank, data=torch.full((1000,), rank))}, pg=group)
            assert taken.path == f"{root}/from-rank-0"
        return "; ".join(str(w.message) for w in caught)
    return ""


def test_sub_group_and_rank_zero_path_wins(tmp_path: Path) -> None:
    results = run_ranks(4, _subgroup, str(tmp_path))
    manifest = Snapshot(str(tmp_path / "from-rank-0")).get_manifest()
    assert manifest["0/s/rank"].value == 0 and manifest["1/s/rank"].value == 2  # type: ignore[union-attr]
    assert json.loads((tmp_path / "from-rank-0" / ".snapshot_metadata").read_text())["world_size"] == 2
    assert not (tmp_path / "from-rank-2").exists()
    assert "rank 0's" in results[0]


def _process_local_store(rank: int, world: int) -> tuple[str, list[str]]:
    from snapshotkit.storage._memory import _STORE

    try:
        Snapshot.take("memory://ranks/step_1", {"s": StateDict(x=torch.ones(1000) * rank)})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", sorted(_STORE)
    return "no error", sorted(_STORE)


def test_a_process_local_store_is_refused_with_many_ranks() -> None:
    # Before: every rank wrote its data objects into its own process's memory, rank 0 committed a
    # manifest that named the other ranks' objects, and no rank could restore the snapshot.
    results = run_ranks(2, _process_local_store, timeout=60)
    assert results[0][0].startswith("ConfigError: 'memory://ranks/step_1' is a process-local store")
    assert "with 2 ranks" in results[0][0]
    assert results[1][0].startswith("RankFailedError") and "process-local store" in results[1][0]
    assert results[0][1] == results[1][1] == []  # nothing written on any rank


def _take_into_a_manager_root(rank: int, world: int, root: str) -> list[str]:
    from snapshotkit import SnapshotManager

    with SnapshotManager(root, preemption_signals=(), async_executor=None) as mgr:
        mgr.save(1, {"s": StateDict(x=torch.ones(10) * rank)})
    found = []
    for take in (Snapshot.take, Snapshot.async_take):
        try:
            take(root, {"s": StateDict(x=torch.ones(10) * rank)})
        except Exception as exc:
            found.append(f"{type(exc).__name__}: {exc}")
        else:
            found.append("no error")
    return found


def test_a_take_into_a_manager_root_is_refused_on_every_rank(tmp_path: Path) -> None:
    # Before: the ranks wrote a snapshot at the root itself, beside step_1.
    root = tmp_path / "run"
    results = run_ranks(2, _take_into_a_manager_root, str(root), timeout=60)
    for message in results[0]:
        assert message.startswith(f"FolderOfSnapshotsError: {str(root)!r} is a folder of 1 snapshot (step_1)")
    for message in results[1]:
        assert message.startswith("RankFailedError") and "is a folder of 1 snapshot" in message
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]
