"""``snapshotkit.lightning.SnapshotCheckpointIO``: the CheckpointIO calls on their own, then real
``Trainer`` runs of both Lightning distributions (``lightning.pytorch`` and ``pytorch_lightning``):
ModelCheckpoint's top-k and last checkpoints written as snapshots and removed safely, and a fit
resumed from ``last.ckpt`` bit for bit equal to an uninterrupted run, sync and async, on local
disk and through ``s3://``."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot
from snapshotkit.errors import (
    ChecksumMismatchError,
    ConfigError,
    IntegrityError,
    InvalidArgumentError,
    SnapshotNotFoundError,
    StorageError,
    UnsafeObjectError,
)
from snapshotkit.lightning import SnapshotCheckpointIO
from snapshotkit.verify import verify_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
import _storage_doubles
from _snapshots import files_of, flip_byte, piece_of

from ._trainer import BATCHES_PER_EPOCH, FLAVOURS, Flavour, assert_same_state, data, state_of

_storage_doubles.register()

pytestmark = [
    pytest.mark.timeout(180),
    # Lightning's own notices on a tiny CPU run (few dataloader workers, few batches, its pytree use)
    pytest.mark.filterwarnings("ignore::UserWarning:lightning"),
    pytest.mark.filterwarnings("ignore::UserWarning:pytorch_lightning"),
    pytest.mark.filterwarnings("ignore::UserWarning:lightning_fabric"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated:DeprecationWarning"),
]

MANIFEST = ".snapshot_metadata"


def checkpoint_dict() -> dict[str, Any]:
    """What a Trainer's checkpoint holds, in kind: ordered tensors, int keys, tuples, primitives."""
    torch.manual_seed(3)
    weight = torch.randn(4, 3)
    return {
        "epoch": 2,
        "global_step": 12,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": OrderedDict([("net.0.weight", weight), ("net.0.bias", torch.zeros(4, dtype=torch.bfloat16))]),
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 3}}, "state_dict": {}}},
        "callbacks": {"BatchCounter": {"batches": 12, "loss_sum": 0.25}},
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(12.0), "exp_avg": torch.ones(4, 3)}},
                "param_groups": [{"lr": 0.05, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None}],
            }
        ],
        "lr_schedulers": [{"last_epoch": 12, "_last_lr": [0.0125]}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"hidden": 8, "name": "tiny"},
    }


def assert_equal_dicts(a: Any, b: Any, where: str = "") -> None:
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.device == b.device and torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_equal_dicts(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_dicts(x, y, f"{where}/{index}")
    else:
        assert a == b, where


def snapshot_names(folder: Path) -> list[str]:
    """The entries of ``folder``, each checked to be a committed, intact snapshot holding nothing else."""
    names = sorted(p.name for p in folder.iterdir())
    for name in names:
        files = files_of(folder / name)
        assert MANIFEST in files, f"{name} is not a committed snapshot: {sorted(files)}"
        assert all(f == MANIFEST or f.startswith("data/") for f in files), sorted(files)
        assert verify_snapshot(str(folder / name)).ok
    return names


# ---------------------------------------------------------------- the CheckpointIO calls


def test_import_snapshotkit_does_not_import_lightning_and_without_it_the_module_says_what_to_install() -> None:
    code = (
        "import sys, snapshotkit, snapshotkit.convert\n"
        "print(sorted(m for m in sys.modules if 'lightning' in m))\n"
        "sys.modules['lightning'] = sys.modules['lightning_fabric'] = None  # as if neither were installed\n"
        "try:\n"
        "    import snapshotkit.lightning\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    imported, message = done.stdout.splitlines()
    assert imported == "[]"
    assert 'pip install "snapshotkit[integrations]"' in message and "pip install lightning" in message


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_trainer_takes_it_as_its_checkpoint_io(flavour: str, tmp_path: Path) -> None:
    lightning = Flavour.load(flavour)
    io = SnapshotCheckpointIO()
    trainer = lightning.trainer(tmp_path, 1, plugins=[io], callbacks=[])
    assert trainer.strategy.checkpoint_io is io


def test_a_checkpoint_round_trips_with_natural_logical_paths(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    checkpoint = checkpoint_dict()
    path = tmp_path / "epoch=2-step=12.ckpt"
    io.save_checkpoint(checkpoint, path)

    snapshot = Snapshot(str(path))
    paths = {name.split("/", 1)[1] for name in snapshot.metadata.manifest}
    assert {
        "state_dict/net.0.weight",
        "optimizer_states/0/state/0/exp_avg",
        "optimizer_states/0/param_groups/0/betas",
        "loops/fit_loop/epoch_progress/total/ready",
        "epoch",
        "pytorch-lightning_version",
    } <= paths
    assert torch.equal(snapshot.read_object("state_dict/net.0.weight"), checkpoint["state_dict"]["net.0.weight"])
    assert verify_snapshot(str(path)).ok

    loaded = io.load_checkpoint(path)
    assert_equal_dicts(loaded, checkpoint)  # OrderedDict, int keys, tuple, bfloat16, None, order of keys
    assert list(loaded) == list(checkpoint)


def test_map_location_follows_torch_load(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    path = tmp_path / "ckpt"
    io.save_checkpoint(checkpoint_dict(), path)

    def devices(checkpoint: dict[str, Any]) -> set[str]:
        found = {t.device.type for t in checkpoint["state_dict"].values()}
        return found | {t.device.type for t in checkpoint["optimizer_states"][0]["state"][0].values()}

    assert devices(io.load_checkpoint(path)) == {"cpu"}
    assert devices(io.load_checkpoint(path, map_location="meta")) == {"meta"}
    assert devices(io.load_checkpoint(path, map_location=torch.device("meta"))) == {"meta"}
    assert devices(io.load_checkpoint(path, map_location={"cpu": "meta"})) == {"meta"}
    assert devices(io.load_checkpoint(path, map_location={"cuda:0": "meta"})) == {"cpu"}  # not from there
    seen: list[str] = []

    def to_meta(storage: Any, location: str) -> Any:
        seen.append(location)
        return torch.empty(0, device="meta").untyped_storage()

    assert devices(io.load_checkpoint(path, map_location=to_meta)) == {"meta"}
    assert set(seen) == {"cpu"} and len(seen) == 4  # every tensor, with the location it was saved from
    assert devices(io.load_checkpoint(path, map_location=lambda storage, location: None)) == {"cpu"}
    with pytest.raises(InvalidArgumentError, match="map_location"):
        io.load_checkpoint(path, map_location=3)


def test_a_damaged_checkpoint_fails_to_load_with_our_error(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(checkpoint_dict(), path)
    data_file, start, _ = piece_of(path, "optimizer_states/0/state/0/exp_avg")
    flip_byte(data_file, start + 5)
    with pytest.raises(ChecksumMismatchError, match="optimizer_states/0/state/0/exp_avg") as info:
        io.load_checkpoint(path)
    assert "verify" in str(info.value)
    with pytest.raises(SnapshotNotFoundError):
        io.load_checkpoint(tmp_path / "absent.ckpt")


def test_objects_load_under_weights_only(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    checkpoint = {"hyper_parameters": {"when": threading.Lock}, "epoch": 1}  # a class: torch.load refuses it
    io.save_checkpoint(checkpoint, tmp_path / "c")
    with pytest.raises(UnsafeObjectError):
        io.load_checkpoint(tmp_path / "c")
    with pytest.raises(UnsafeObjectError):
        io.load_checkpoint(tmp_path / "c", weights_only=True)
    assert io.load_checkpoint(tmp_path / "c", weights_only=False)["hyper_parameters"]["when"] is threading.Lock


def test_remove_deletes_the_snapshot_and_only_it(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    kept, removed = tmp_path / "epoch=0-step=2.ckpt", tmp_path / "epoch=0-step=4.ckpt"
    io.save_checkpoint(checkpoint_dict(), kept)
    io.save_checkpoint(checkpoint_dict(), removed)
    (removed / "notes.txt").write_text("mine")  # not written by a take: stays

    io.remove_checkpoint(removed)
    assert files_of(removed) == {"notes.txt": b"mine"}
    with pytest.raises(SnapshotNotFoundError):
        _ = Snapshot(str(removed)).metadata
    io.remove_checkpoint(tmp_path / "never-written.ckpt")  # nothing there: nothing to do
    assert verify_snapshot(str(kept)).ok


def test_saving_onto_a_snapshot_replaces_it(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    path = tmp_path / "last.ckpt"
    first = checkpoint_dict()
    io.save_checkpoint(first, path)
    old_objects = set(files_of(path))
    second = {**first, "global_step": 13, "state_dict": OrderedDict(w=torch.arange(3.0))}
    io.save_checkpoint(second, path)
    assert_equal_dicts(io.load_checkpoint(path), second)
    assert not (set(files_of(path)) - {MANIFEST}) & old_objects  # the old data objects are gone
    assert verify_snapshot(str(path)).ok


def test_wrong_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    io = SnapshotCheckpointIO()
    with pytest.raises(InvalidArgumentError, match="dict"):
        io.save_checkpoint([1, 2], tmp_path / "a")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="str"):
        io.save_checkpoint({1: torch.zeros(1)}, tmp_path / "a")  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="storage_options"):
        io.save_checkpoint({"w": torch.zeros(1)}, tmp_path / "a", storage_options="fast")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="executor"):
        SnapshotCheckpointIO(async_save=True, executor="fiber")
    with pytest.raises(ConfigError, match="memory_budget_bytes"):
        SnapshotCheckpointIO(memory_budget_bytes=0)
    with pytest.raises(InvalidArgumentError, match="async_save"):
        SnapshotCheckpointIO(async_save="yes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- async saves, writes held at a gate


def _in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_async_save_returns_staged_and_load_remove_teardown_wait(tmp_path: Path) -> None:
    with _storage_doubles.Gate(tmp_path / "gate") as gate:
        io = SnapshotCheckpointIO(async_save=True, storage_options={"gate": gate.path})
        first, second = f"gated://{tmp_path}/epoch=0-step=2.ckpt", f"gated://{tmp_path}/epoch=0-step=4.ckpt"
        checkpoint = checkpoint_dict()
        original = checkpoint["state_dict"]["net.0.weight"].clone()
        io.save_checkpoint(checkpoint, first)  # returns with every write held at the gate
        checkpoint["state_dict"]["net.0.weight"].add_(1)  # training goes on: the save has its copy
        io.save_checkpoint(checkpoint, second)  # queues behind the first, does not wait for it
        with pytest.raises(SnapshotNotFoundError):
            _ = Snapshot(first).metadata

        loading, loaded = _in_thread(lambda: io.load_checkpoint(first))
        removing, removed = _in_thread(lambda: io.remove_checkpoint(second))
        loading.join(0.5)
        removing.join(0.5)
        assert loading.is_alive() and removing.is_alive()  # both wait for their path's save
        gate.open()
        loading.join(60)
        removing.join(60)
    assert not isinstance(loaded[0], BaseException), repr(loaded[0])
    assert torch.equal(loaded[0]["state_dict"]["net.0.weight"], original)
    assert removed == [None] and files_of(tmp_path / "epoch=0-step=4.ckpt") == {}
    assert verify_snapshot(first).ok
    io.teardown()


def test_a_failed_async_save_raises_from_teardown(tmp_path: Path) -> None:
    with _storage_doubles.Gate(tmp_path / "gate") as gate:
        io = SnapshotCheckpointIO(async_save=True, storage_options={"gate": gate.path, "fail": True})
        io.save_checkpoint(checkpoint_dict(), f"gated://{tmp_path}/last.ckpt")
        gate.open()
        with pytest.raises(StorageError, match="No space left") as info:
            io.teardown()
    assert isinstance(info.value.__cause__, OSError)
    io.teardown()  # raised once
    assert files_of(tmp_path / "last.ckpt") == {}


def test_a_failed_async_save_raises_from_the_next_save(tmp_path: Path) -> None:
    with _storage_doubles.Gate(tmp_path / "gate") as gate:
        io = SnapshotCheckpointIO(async_save=True, storage_options={"gate": gate.path, "fail": True})
        path = f"gated://{tmp_path}/last.ckpt"
        io.save_checkpoint(checkpoint_dict(), path)
        gate.open()
        with pytest.raises(StorageError, match="No space left"):
            io.save_checkpoint(checkpoint_dict(), path)  # the same path: waits for the failed one


# ---------------------------------------------------------------- real Trainer runs


def _checkpointing(lightning: Flavour, folder: Path) -> Any:
    return lightning.ModelCheckpoint(
        dirpath=str(folder), save_top_k=2, save_last=True, every_n_train_steps=2, monitor="step", mode="max"
    )


def _names(steps: tuple[int, ...]) -> list[str]:
    return sorted([*(f"epoch={(s - 1) // BATCHES_PER_EPOCH}-step={s}.ckpt" for s in steps), "last.ckpt"])


def _resume_matches_an_uninterrupted_run(lightning: Flavour, root: Path, make_io: Any, *, by_name: bool) -> None:
    """12 steps in one run == 8 steps checkpointed by ``make_io()``'s plugin, then 4 resumed from
    last.ckpt (``by_name``: Lightning finds it from ``ckpt_path="last"``, listing the folder)."""
    counter = lightning.counter()
    full, module = lightning.trainer(root / "full", 12, plugins=[], callbacks=[counter]), lightning.module()
    full.fit(module, data())
    expected = state_of(full, module, counter)

    folder = root / "ckpt"
    counter = lightning.counter()
    first = lightning.trainer(
        root / "a", 8, plugins=[make_io()], callbacks=[counter, _checkpointing(lightning, folder)]
    )
    first.fit(lightning.module(), data())
    assert snapshot_names(folder) == _names((6, 8))  # top-2 by step, and last; the others removed whole
    assert Snapshot(str(folder / "last.ckpt")).read_object("global_step") == 8

    counter, module = lightning.counter(), lightning.module(seed=7)  # other weights: the checkpoint's must win
    resumed = lightning.trainer(
        root / "b", 12, plugins=[make_io()], callbacks=[counter, _checkpointing(lightning, folder)]
    )
    resumed.fit(module, data(), ckpt_path="last" if by_name else str(folder / "last.ckpt"))
    assert_same_state(state_of(resumed, module, counter), expected)
    assert snapshot_names(folder) == _names((10, 12))


@pytest.mark.parametrize(
    ("flavour", "async_save"),
    [
        ("lightning.pytorch", False),
        pytest.param("lightning.pytorch", True, marks=pytest.mark.slow),
        pytest.param("pytorch_lightning", False, marks=pytest.mark.slow),
        pytest.param("pytorch_lightning", True, marks=pytest.mark.slow),
    ],
)
def test_fit_resumes_from_last_ckpt_exactly(flavour: str, async_save: bool, tmp_path: Path) -> None:
    lightning = Flavour.load(flavour)
    _resume_matches_an_uninterrupted_run(
        lightning, tmp_path, lambda: SnapshotCheckpointIO(async_save=async_save), by_name=async_save
    )


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_of_last_ckpt_that_fails_midway_leaves_the_previous_one_to_resume_from(
    async_save: bool, tmp_path: Path
) -> None:
    """Saving onto last.ckpt replaces it atomically: a save whose data writes fail leaves the
    previous last.ckpt untouched, and a fit resumed from it is exactly the uninterrupted run.
    Before, the save deleted the previous last.ckpt first, and nothing was left to resume from."""
    lightning = Flavour.load("lightning.pytorch")
    counter = lightning.counter()
    full, module = lightning.trainer(tmp_path / "full", 12, plugins=[], callbacks=[counter]), lightning.module()
    full.fit(module, data())
    expected = state_of(full, module, counter)

    folder, io = tmp_path / "ckpt", SnapshotCheckpointIO(async_save=async_save)
    first = lightning.trainer(
        tmp_path / "a", 8, plugins=[io], callbacks=[lightning.counter(), _checkpointing(lightning, folder)]
    )
    first.fit(lightning.module(), data())
    last = folder / "last.ckpt"
    before = files_of(last)
    # The same directory through a store whose data object writes fail (ENOSPC), as a full disk would.
    failing = {"gate": str(tmp_path / "open-gate"), "fail": True}
    if async_save:  # save_checkpoint returns once staged; the background failure comes from teardown
        first.save_checkpoint(f"gated://{last}", storage_options=failing)
    with pytest.raises(StorageError, match="No space left"):
        io.teardown() if async_save else first.save_checkpoint(f"gated://{last}", storage_options=failing)
    assert files_of(last) == before  # the previous checkpoint, whole; nothing of the failed save

    counter, module = lightning.counter(), lightning.module(seed=7)
    resumed = lightning.trainer(
        tmp_path / "b", 12, plugins=[SnapshotCheckpointIO()], callbacks=[counter, _checkpointing(lightning, folder)]
    )
    resumed.fit(module, data(), ckpt_path=str(last))
    assert_same_state(state_of(resumed, module, counter), expected)


@pytest.mark.slow
def test_fit_resumes_exactly_with_the_process_executor(tmp_path: Path) -> None:
    lightning = Flavour.load("lightning.pytorch")
    _resume_matches_an_uninterrupted_run(
        lightning, tmp_path, lambda: SnapshotCheckpointIO(async_save=True, executor="process"), by_name=False
    )


def test_fit_from_a_damaged_checkpoint_raises_our_error(tmp_path: Path) -> None:
    lightning = Flavour.load("lightning.pytorch")
    trainer = lightning.trainer(tmp_path / "a", 2, plugins=[SnapshotCheckpointIO()], callbacks=[])
    trainer.fit(lightning.module(), data())
    path = tmp_path / "saved.ckpt"
    trainer.save_checkpoint(path)
    data_file, start, _ = piece_of(path, "state_dict/net.0.weight")
    flip_byte(data_file, start)
    again = lightning.trainer(tmp_path / "b", 4, plugins=[SnapshotCheckpointIO()], callbacks=[])
    with pytest.raises(IntegrityError, match=r"state_dict/net\.0\.weight"):
        again.fit(lightning.module(), data(), ckpt_path=str(path))


@pytest.mark.slow
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fit_saves_removes_and_resumes_through_s3(
    flavour: str,
    seaweed_s3_endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    import boto3
    import s3fs

    bucket = f"lightning-{flavour.replace('.', '-').replace('_', '-')}"
    boto3.client("s3", endpoint_url=seaweed_s3_endpoint).create_bucket(Bucket=bucket)
    # ModelCheckpoint lists and checks its dirpath with its own fsspec filesystem
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed_s3_endpoint)
    request.addfinalizer(s3fs.S3FileSystem.clear_instance_cache)  # fsspec keeps that filesystem
    lightning = Flavour.load(flavour)
    options = {"endpoint_url": seaweed_s3_endpoint}
    folder = f"s3://{bucket}/run"

    def checkpointing() -> Any:
        return lightning.ModelCheckpoint(
            dirpath=folder, save_top_k=1, save_last=True, every_n_train_steps=2, monitor="step", mode="max"
        )

    counter = lightning.counter()
    full, module = lightning.trainer(tmp_path / "full", 12, plugins=[], callbacks=[counter]), lightning.module()
    full.fit(module, data())
    expected = state_of(full, module, counter)

    io = SnapshotCheckpointIO(async_save=True, storage_options=options)
    first = lightning.trainer(tmp_path / "a", 8, plugins=[io], callbacks=[lightning.counter(), checkpointing()])
    first.fit(lightning.module(), data())
    objects = boto3.client("s3", endpoint_url=seaweed_s3_endpoint).list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted({o["Key"].split("/")[1] for o in objects}) == ["epoch=1-step=8.ckpt", "last.ckpt"]
    assert verify_snapshot(f"{folder}/last.ckpt", storage_options=options).ok

    counter, module = lightning.counter(), lightning.module(seed=7)
    resumed = lightning.trainer(
        tmp_path / "b",
        12,
        plugins=[SnapshotCheckpointIO(storage_options=options)],
        callbacks=[counter, checkpointing()],
    )
    resumed.fit(module, data(), ckpt_path=f"{folder}/last.ckpt")
    assert_same_state(state_of(resumed, module, counter), expected)
