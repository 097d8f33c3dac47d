"""snapshotkit.dcp on real gloo ranks: 2 ranks save DTensor (Shard(0)) state with DCP's default
planner (sync and async_save), then 1 rank and 2 ranks (another sharding) load it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner

from snapshotkit import Snapshot
from snapshotkit.cli import main
from snapshotkit.dcp import SnapshotReader, SnapshotWriter
from snapshotkit.errors import IncompleteSnapshotError
from snapshotkit.manifest import ObjectEntry

from ._harness import run_ranks

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

ROWS, COLUMNS = 64, 48


def _weight() -> torch.Tensor:
    return torch.arange(ROWS * COLUMNS, dtype=torch.float32).reshape(ROWS, COLUMNS)


def _bias() -> torch.Tensor:
    return torch.linspace(0, 1, COLUMNS)


def _save(rank: int, world: int, root: str) -> list[int]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    state = {
        "model": {"w": distribute_tensor(_weight(), mesh, [Shard(0)]), "b": _bias()},  # b: on every rank
        "extra": {"step": 3, "note": "same on every rank"},
    }
    writer = SnapshotWriter(f"{root}/step_1")
    dcp.save(state, storage_writer=writer)
    written = [writer.written_bytes]
    state["model"]["w"] = distribute_tensor(_weight() + 1, mesh, [Shard(0)])
    incremental = SnapshotWriter(f"{root}/step_2", base=f"{root}/step_1")  # only w changed
    pending = dcp.async_save(state, storage_writer=incremental)
    pending.result()
    return [*written, incremental.written_bytes]


def _load(rank: int, world: int, root: str, step: str) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    state = {
        "model": {"w": distribute_tensor(torch.zeros(ROWS, COLUMNS), mesh, [Shard(1)]), "b": torch.zeros(COLUMNS)},
        "extra": {"step": 0, "note": ""},
    }
    dcp.load(state, storage_reader=SnapshotReader(f"{root}/{step}"))
    # DCP keys are global: every rank's view of the snapshot holds b, whichever rank wrote it
    read = Snapshot(f"{root}/{step}").read_object("model/b")
    return {
        "w": state["model"]["w"].full_tensor(),
        "b": state["model"]["b"],
        "step": state["extra"]["step"],
        "read": read,
    }


def test_two_ranks_save_and_one_or_two_load(tmp_path: Path) -> None:
    root = str(tmp_path)
    written = run_ranks(2, _save, root, env={"SNAPSHOTKIT_MIN_REFERENCE_BYTES": "64"})
    snapshot = Snapshot(f"{root}/step_1")
    # b is on every rank: DCP's planner gives it to one, so it is written once (so are the objects)
    objects = sum(e.piece.nbytes for e in snapshot.get_manifest().values() if isinstance(e, ObjectEntry))
    assert sum(w[0] for w in written) == ROWS * COLUMNS * 4 + COLUMNS * 4 + objects
    # the incremental async_save wrote w again and referenced b and the objects in step_1
    assert sum(w[1] for w in written) == ROWS * COLUMNS * 4
    assert set(Snapshot(f"{root}/step_2").metadata.bases) == {"../step_1"}
    assert torch.equal(snapshot.read_object("model/w"), _weight())
    assert torch.equal(snapshot.read_object("model/b"), _bias())
    assert snapshot.read_object("extra/step") == 3

    # one process loads what two saved (resharding to a whole tensor)
    state = {
        "model": {"w": torch.zeros(ROWS, COLUMNS), "b": torch.zeros(COLUMNS)},
        "extra": {"step": 0, "note": ""},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=SnapshotReader(f"{root}/step_2"), no_dist=True)
    assert torch.equal(state["model"]["w"], _weight() + 1) and torch.equal(state["model"]["b"], _bias())
    assert state["extra"] == {"step": 3, "note": "same on every rank"}

    # two ranks load into Shard(1): each reads the column block it needs of both row shards
    for loaded in run_ranks(2, _load, root, "step_1"):
        assert torch.equal(loaded["w"], _weight()) and torch.equal(loaded["b"], _bias()) and loaded["step"] == 3
        assert torch.equal(loaded["read"], _bias())


def _save_in_checkpoint_process(rank: int, world: int, path: str) -> bool:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    state = {"w": _weight(), "extra": {"step": 5}}
    pending = dcp.async_save(
        state, storage_writer=SnapshotWriter(path), async_checkpointer_type=AsyncCheckpointerType.PROCESS
    )
    pending.result()
    loaded = {"w": torch.zeros(ROWS, COLUMNS), "extra": {"step": 0}}
    dcp.load(loaded, storage_reader=SnapshotReader(path))
    return torch.equal(loaded["w"], _weight()) and loaded["extra"]["step"] == 5


def test_async_save_in_dcps_checkpoint_process(tmp_path: Path) -> None:
    # the writer is pickled to DCP's checkpoint process, which writes and commits there
    assert run_ranks(1, _save_in_checkpoint_process, str(tmp_path / "step_1")) == [True]
    assert Snapshot(str(tmp_path / "step_1")).read_object("extra/step") == 5


def _save_failing_on_rank_1(rank: int, world: int, path: str) -> str:
    import sys

    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.tensor import Shard, distribute_tensor

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
    import _storage_doubles

    _storage_doubles.register()
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
    state = {"model": {"w": distribute_tensor(_weight(), mesh, [Shard(0)])}}
    try:
        dcp.save(state, storage_writer=SnapshotWriter(f"failing://{path}"))
    except CheckpointException as exc:
        return str(exc)
    return "saved"


def test_a_rank_that_fails_fails_the_save_and_nothing_opens(tmp_path: Path) -> None:
    path = tmp_path / "step_1"
    outcomes = run_ranks(2, _save_failing_on_rank_1, str(path), env={"SNAPSHOTKIT_TEST_FAIL_RANK": "1"})
    assert all("No space left on device" in outcome for outcome in outcomes), outcomes
    with pytest.raises(IncompleteSnapshotError):  # rank 0's part stays, without a manifest
        Snapshot(str(path)).metadata
    leftovers = sorted(p.name for p in (path / "data").iterdir())
    assert len(leftovers) == 1, leftovers  # rank 0's chunk; rank 1 keeps nothing of its failed part
    cleanup = CliRunner().invoke(main, ["cleanup", str(tmp_path)], catch_exceptions=False)
    assert cleanup.exit_code == 0 and not path.exists(), cleanup.output


def _save_without_collectives(rank: int, world: int, path: str) -> str:
    try:
        dcp.save({f"w{rank}": torch.ones(4)}, storage_writer=SnapshotWriter(path), use_collectives=False)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "saved"


def test_use_collectives_false_on_several_ranks_is_refused(tmp_path: Path) -> None:
    # each rank would commit its own part as the snapshot: refused on every rank, nothing written
    outcomes = run_ranks(2, _save_without_collectives, str(tmp_path / "step_1"))
    assert all("InvalidArgumentError" in o and "use_collectives=False" in o for o in outcomes), outcomes
    assert not (tmp_path / "step_1").exists()
