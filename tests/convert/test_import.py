"""``snapshotkit.convert.import_snapshot``: torch.save files, safetensors files and Hugging Face
sharded directories, DCP and torchsnapshot checkpoints, each written here by the library itself,
become snapshots that restore into fresh objects and read back bit-exact against the source.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from _snapshots import Opaque

from snapshotkit import Snapshot, StateDict
from snapshotkit.convert import ImportReport, import_snapshot
from snapshotkit.errors import (
    ConfigError,
    ImportSourceError,
    InvalidArgumentError,
    SnapshotExistsError,
    SnapshotNotFoundError,
    UnsafeObjectError,
)

pytestmark = pytest.mark.usefixtures("clean_env")


# --- helpers ---------------------------------------------------------------------------------


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model(seed)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optim.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optim.step()
    return model, optim


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model(seed=99)
    return model, torch.optim.Adam(model.parameters(), lr=0.5)


def assert_bit_exact(actual: Any, expected: Any, where: str = "") -> None:
    """Same structure, same types, every tensor and float the same bits."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        left, right = actual.detach().reshape(-1), expected.detach().reshape(-1)
        if left.dtype not in (torch.bool, torch.uint8):
            left, right = left.view(torch.uint8), right.view(torch.uint8)
        assert torch.equal(left, right), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert list(actual) == list(expected), where
        for name in expected:
            assert_bit_exact(actual[name], expected[name], f"{where}/{name}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_bit_exact(a, e, f"{where}/{i}")
    elif isinstance(expected, float):
        assert type(actual) is float and struct.pack("<d", actual) == struct.pack("<d", expected), where
    else:
        assert type(actual) is type(expected) and actual == expected, where


def _value_at(source: Any, logical_path: str) -> Any:
    node = source
    for part in logical_path.split("/"):
        name = part.replace("%2F", "/").replace("%25", "%")
        key: str | int = name if isinstance(node, dict) and name in node else int(name)
        node = node[key]
    return node


def assert_reads_back(report: ImportReport, source: dict[str, Any]) -> None:
    """Every leaf of the snapshot reads back bit-exact against the source, and nothing is missing."""
    snapshot = Snapshot(report.path)
    assert report.logical_paths
    for path in report.logical_paths:
        assert_bit_exact(snapshot.read_object(path, weights_only=False), _value_at(source, path), path)
    for name, state in source.items():
        assert_bit_exact(snapshot.read_object(name, weights_only=False), state, name)


def _same_optimizer_state(actual: torch.optim.Optimizer, expected: torch.optim.Optimizer) -> None:
    assert_bit_exact(actual.state_dict(), expected.state_dict(), "optim")


# --- torch.save ------------------------------------------------------------------------------


def test_torch_file_with_nested_dicts_and_optimizer_state(tmp_path: Path) -> None:
    model, optim = _trained()
    source = {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "epoch": 3,
        "extra": {"nested": {"a": [torch.arange(6).reshape(2, 3), 2.5, None], "b": (1, "x")}, "name": "run"},
    }
    torch.save(source, tmp_path / "ckpt.pt")

    report = import_snapshot(tmp_path / "ckpt.pt", tmp_path / "out")

    assert report.source_format == "torch"
    assert report.source == str(tmp_path / "ckpt.pt")
    assert report.path == str(tmp_path / "out")
    assert "model/0.weight" in report.logical_paths
    assert "optim/state/0/exp_avg" in report.logical_paths
    assert "epoch" in report.logical_paths
    assert report.nbytes >= sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert report.skipped_paths == ()
    fresh_model, fresh_optim = _fresh()
    Snapshot(report.path).restore({"model": fresh_model, "optim": fresh_optim})
    assert_bit_exact(fresh_model.state_dict(), model.state_dict(), "model")
    _same_optimizer_state(fresh_optim, optim)
    assert_reads_back(report, source)
    provenance = Snapshot(report.path).metadata.user_metadata["snapshotkit.import"]
    assert provenance == {"source_format": "torch", "source": str(tmp_path / "ckpt.pt")}


def test_bare_state_dict_goes_under_key(tmp_path: Path) -> None:
    model = _model()
    torch.save(model.state_dict(), tmp_path / "weights.pth")

    report = import_snapshot(str(tmp_path / "weights.pth"), str(tmp_path / "out"))
    assert report.logical_paths == tuple(f"model/{name}" for name in model.state_dict())
    fresh = _model(seed=5)
    Snapshot(report.path).restore({"model": fresh})
    assert_bit_exact(fresh.state_dict(), model.state_dict())

    named = import_snapshot(tmp_path / "weights.pth", tmp_path / "out2", key="net", source="torch")
    assert named.logical_paths[0] == "net/0.weight"


def test_legacy_torch_file(tmp_path: Path) -> None:
    model = _model()
    torch.save({"model": model.state_dict(), "step": 7}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    report = import_snapshot(tmp_path / "old.pt", tmp_path / "out")
    fresh = _model(seed=5)
    Snapshot(report.path).restore({"model": fresh})
    assert_bit_exact(fresh.state_dict(), model.state_dict())
    assert Snapshot(report.path).read_object("step") == 7


def test_torch_file_tensors_are_mapped_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.save({"w": torch.ones(4)}, tmp_path / "w.pt")
    seen: list[bool] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("mmap", False))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    import_snapshot(tmp_path / "w.pt", tmp_path / "out")
    assert seen == [True]


def test_pickled_object_is_refused_unless_weights_only_false(tmp_path: Path) -> None:
    torch.save({"model": _model().state_dict(), "thing": Opaque(41)}, tmp_path / "ckpt.pt")

    with pytest.raises(UnsafeObjectError) as info:
        import_snapshot(tmp_path / "ckpt.pt", tmp_path / "out")
    message = str(info.value)
    assert str(tmp_path / "ckpt.pt") in message
    assert "Opaque" in message
    assert "weights_only=False" in message
    with pytest.raises(SnapshotNotFoundError):  # nothing was written
        _ = Snapshot(str(tmp_path / "out")).metadata

    report = import_snapshot(tmp_path / "ckpt.pt", tmp_path / "out", weights_only=False)
    thing = Snapshot(report.path).read_object("thing", weights_only=False)
    assert isinstance(thing, Opaque) and thing.value == 41
    with pytest.raises(UnsafeObjectError):  # the snapshot keeps the rule: restoring it needs the opt-in too
        Snapshot(report.path).read_object("thing")


# --- safetensors -----------------------------------------------------------------------------


def _safetensors_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    state = {
        "embed.weight": torch.randn(10, 4),
        "layers.0.attn.weight": torch.randn(4, 4).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(4).to(torch.float16),
        "layers.0.mask": torch.tensor([True, False, True]),
        "ids": torch.arange(5, dtype=torch.int64),
        "bytes": torch.arange(7, dtype=torch.uint8),
        "scale": torch.tensor(0.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
    }
    if hasattr(torch, "float8_e4m3fn"):
        state["fp8"] = torch.randn(6).to(torch.float8_e4m3fn)
    return state


def _safe_open_all(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def test_safetensors_file(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = _safetensors_state()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    report = import_snapshot(tmp_path / "model.safetensors", tmp_path / "out")

    assert report.source_format == "safetensors"
    assert sorted(report.logical_paths) == sorted(f"model/{name}" for name in state)
    expected = _safe_open_all(tmp_path / "model.safetensors")
    for name, tensor in expected.items():
        assert_bit_exact(Snapshot(report.path).read_object(f"model/{name}"), tensor, name)
    provenance = Snapshot(report.path).metadata.user_metadata["snapshotkit.import"]
    assert provenance["safetensors_metadata"] == {"format": "pt"}


def test_safetensors_restores_into_a_module(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = _model()
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    report = import_snapshot(tmp_path, tmp_path.parent / (tmp_path.name + "-out"))  # the directory holding it
    fresh = _model(seed=5)
    Snapshot(report.path).restore({"model": fresh})
    assert_bit_exact(fresh.state_dict(), model.state_dict())


def test_safetensors_misaligned_tensor_is_copied(tmp_path: Path) -> None:
    # The format allows any offsets; a float32 right after 3 bytes cannot be viewed in place.
    header = {
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
    }
    text = json.dumps(header).encode()
    data = bytes([1, 2, 3]) + struct.pack("<2f", 1.5, -2.0)
    (tmp_path / "odd.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)

    report = import_snapshot(tmp_path / "odd.safetensors", tmp_path / "out")
    snapshot = Snapshot(report.path)
    assert snapshot.read_object("model/a").tolist() == [1, 2, 3]
    assert snapshot.read_object("model/b").tolist() == [1.5, -2.0]


def _write_sharded(directory: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    directory.mkdir()
    names = list(state)
    files = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file_name, members in files.items():
        save_file({name: state[name] for name in members}, str(directory / file_name))
        weight_map.update(dict.fromkeys(members, file_name))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text("{}")


def test_hugging_face_sharded_directory(tmp_path: Path) -> None:
    model = _model()
    _write_sharded(tmp_path / "hf", model.state_dict())

    report = import_snapshot(tmp_path / "hf", tmp_path / "out")
    assert report.source_format == "safetensors"
    assert report.source == str(tmp_path / "hf" / "model.safetensors.index.json")
    fresh = _model(seed=5)
    Snapshot(report.path).restore({"model": fresh})
    assert_bit_exact(fresh.state_dict(), model.state_dict())

    by_index = import_snapshot(tmp_path / "hf" / "model.safetensors.index.json", tmp_path / "out2", key="lm")
    assert sorted(by_index.logical_paths) == sorted(f"lm/{name}" for name in model.state_dict())


def test_sharded_directory_with_a_missing_file_is_refused(tmp_path: Path) -> None:
    _write_sharded(tmp_path / "hf", _model().state_dict())
    (tmp_path / "hf" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ImportSourceError, match=r"model-00002-of-00002\.safetensors"):
        import_snapshot(tmp_path / "hf", tmp_path / "out")


def test_truncated_safetensors_file_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.ones(100)}, str(tmp_path / "w.safetensors"))
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(data[:-8])
    with pytest.raises(ImportSourceError, match="truncated"):
        import_snapshot(tmp_path / "w.safetensors", tmp_path / "out")


# --- DCP -------------------------------------------------------------------------------------


def _dcp_save(state: dict[str, Any], path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is not initialized ... single process"
        dcp.save(state, checkpoint_id=str(path))


def test_dcp_checkpoint(tmp_path: Path) -> None:
    model, optim = _trained()
    state = {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "step": 3,
        "extra": {"tag": (1, 2), "weights": [torch.ones(2), 5], "name": "x", "a.b": torch.zeros(1)},
    }
    _dcp_save(state, tmp_path / "dcp")

    report = import_snapshot(tmp_path / "dcp", tmp_path / "out")

    assert report.source_format == "dcp"
    fresh_model, fresh_optim = _fresh()
    Snapshot(report.path).restore({"model": fresh_model, "optim": fresh_optim})
    assert_bit_exact(fresh_model.state_dict(), model.state_dict(), "model")
    _same_optimizer_state(fresh_optim, optim)  # DCP stored the parameter ids as strings; import gives ints back
    expected = {**state, "model": dict(model.state_dict())}  # DCP keeps no OrderedDict
    assert_reads_back(report, expected)


def test_dcp_object_is_refused_unless_weights_only_false(tmp_path: Path) -> None:
    _dcp_save({"model": _model().state_dict(), "thing": Opaque(5)}, tmp_path / "dcp")
    with pytest.raises(UnsafeObjectError, match="Opaque"):
        import_snapshot(tmp_path / "dcp", tmp_path / "out")
    report = import_snapshot(tmp_path / "dcp", tmp_path / "out", weights_only=False)
    assert Snapshot(report.path).read_object("thing", weights_only=False).value == 5


def test_dcp_metadata_is_unpickled_without_running_code(tmp_path: Path) -> None:
    import pickle

    _dcp_save({"model": _model().state_dict()}, tmp_path / "dcp")
    # A crafted .metadata: unpickling it would build a class DCP metadata never holds.
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(Opaque(1)))
    with pytest.raises(ImportSourceError, match=r"Opaque is not a class DCP metadata is made of"):
        import_snapshot(tmp_path / "dcp", tmp_path / "out")


def _dcp_two_ranks(rank: int, world_size: int, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    state = {"model": {"emb": distribute_tensor(full, mesh, [Shard(0)]), "bias": torch.ones(3)}, "step": 4}
    dcp.save(state, checkpoint_id=path)


@pytest.mark.slow
def test_dcp_tensor_saved_in_chunks_by_two_ranks(tmp_path: Path) -> None:
    from multirank._harness import run_ranks

    run_ranks(2, _dcp_two_ranks, str(tmp_path / "dcp"))
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) == 2

    report = import_snapshot(tmp_path / "dcp", tmp_path / "out")
    snapshot = Snapshot(report.path)
    assert_bit_exact(snapshot.read_object("model/emb"), torch.arange(24, dtype=torch.float32).reshape(6, 4))
    assert_bit_exact(snapshot.read_object("model/bias"), torch.ones(3))
    assert snapshot.read_object("step") == 4


# --- torchsnapshot ---------------------------------------------------------------------------


@pytest.fixture
def torchsnapshot() -> Iterator[ModuleType]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script at its import, TypedStorage
        import torchsnapshot

        yield torchsnapshot


def _torchsnapshot_state() -> dict[str, Any]:
    return {
        "step": 3,
        "lr": 0.1,
        "name": "run/1",
        "flag": True,
        "raw": b"\x00\xff",
        "tag": (1, 2),
        "nothing": None,
        "mixed": [1, "a", torch.ones(2)],
        "a/b%c": {7: torch.zeros(2, dtype=torch.int32)},
        "big": torch.arange(1000, dtype=torch.float32).reshape(100, 10),
        "complex": torch.randn(3, dtype=torch.complex64),
        "half": torch.randn(4).to(torch.bfloat16),
    }


def test_torchsnapshot_snapshot(tmp_path: Path, torchsnapshot: ModuleType) -> None:
    from torchsnapshot.knobs import override_max_chunk_size_bytes

    model, optim = _trained()
    extra = _torchsnapshot_state()
    # A 1,000-byte chunk limit splits "big" into chunks (batched back to back in one file);
    # "optim/**" is replicated.
    with override_max_chunk_size_bytes(1000):
        torchsnapshot.Snapshot.take(
            str(tmp_path / "ts"),
            {"model": model, "optim": optim, "extra": torchsnapshot.StateDict(**extra)},
            replicated=["optim/**"],
        )
    manifest = json.loads((tmp_path / "ts" / ".snapshot_metadata").read_text())["manifest"]
    assert manifest["0/extra/big"]["type"] == "ChunkedTensor"
    assert manifest["0/optim/param_groups/0/lr"]["replicated"] is True

    report = import_snapshot(tmp_path / "ts", tmp_path / "out")

    assert report.source_format == "torchsnapshot"
    fresh_model, fresh_optim = _fresh()
    Snapshot(report.path).restore({"model": fresh_model, "optim": fresh_optim})
    assert_bit_exact(fresh_model.state_dict(), model.state_dict(), "model")
    _same_optimizer_state(fresh_optim, optim)
    restored = StateDict()
    Snapshot(report.path).restore({"extra": restored}, weights_only=False)
    assert_bit_exact(dict(restored), extra, "extra")
    assert_reads_back(report, {"model": model.state_dict(), "optim": optim.state_dict(), "extra": extra})


def test_torchsnapshot_unbatched_chunks_and_objects(
    tmp_path: Path, torchsnapshot: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchsnapshot.knobs import override_max_chunk_size_bytes

    monkeypatch.setenv("TORCHSNAPSHOT_DISABLE_BATCHING", "1")  # every chunk in a file of its own
    extra = {"big": torch.randn(50, 8), "thing": Opaque(3), "n": 1}
    with override_max_chunk_size_bytes(512):
        torchsnapshot.Snapshot.take(str(tmp_path / "ts"), {"extra": torchsnapshot.StateDict(**extra)})
    chunks = json.loads((tmp_path / "ts" / ".snapshot_metadata").read_text())["manifest"]["0/extra/big"]["chunks"]
    assert len({chunk["tensor"]["location"] for chunk in chunks}) > 1

    with pytest.raises(UnsafeObjectError, match="extra/thing"):
        import_snapshot(tmp_path / "ts", tmp_path / "out")
    report = import_snapshot(tmp_path / "ts", tmp_path / "out", weights_only=False)
    snapshot = Snapshot(report.path)
    assert_bit_exact(snapshot.read_object("extra/big"), extra["big"])
    assert snapshot.read_object("extra/thing", weights_only=False).value == 3


def test_torchsnapshot_location_leaving_the_snapshot_is_refused(tmp_path: Path, torchsnapshot: ModuleType) -> None:
    (tmp_path / "secret").write_bytes(b"\0" * 64)
    torchsnapshot.Snapshot.take(str(tmp_path / "ts"), {"extra": torchsnapshot.StateDict(w=torch.ones(4))})
    manifest_path = tmp_path / "ts" / ".snapshot_metadata"
    document = json.loads(manifest_path.read_text())
    document["manifest"]["0/extra/w"]["location"] = "../secret"
    manifest_path.write_text(json.dumps(document))
    with pytest.raises(ImportSourceError, match=r"'\.\./secret', which is not a plain relative path"):
        import_snapshot(tmp_path / "ts", tmp_path / "out")


def _torchsnapshot_two_ranks(rank: int, world_size: int, path: str) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    import torch.distributed._shard.sharded_tensor as sharded_tensor
    import torchsnapshot
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(seed=0))  # replicated: stored once, under rank 0
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world_size)])
    emb = sharded_tensor.empty(spec, 6, 4)
    for shard in emb.local_shards():
        shard.tensor.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * rank)
    extra = torchsnapshot.StateDict(rank=rank, own=torch.full((3,), float(rank)), emb=emb)
    torchsnapshot.Snapshot.take(path, {"model": model, "extra": extra})
    return {"model": {k: v.clone() for k, v in model.state_dict().items()}, "own": extra["own"]}


@pytest.mark.slow
def test_torchsnapshot_two_ranks(tmp_path: Path) -> None:
    from multirank._harness import run_ranks

    results = run_ranks(2, _torchsnapshot_two_ranks, str(tmp_path / "ts"))

    report = import_snapshot(tmp_path / "ts", tmp_path / "out")

    assert report.skipped_paths == ("1/extra/rank", "1/extra/own")
    snapshot = Snapshot(report.path)
    wrapped = DdpWrapped()
    Snapshot(report.path).restore({"model": wrapped})
    assert_bit_exact(dict(wrapped.state_dict()), results[0]["model"])
    assert snapshot.read_object("extra/rank") == 0
    assert_bit_exact(snapshot.read_object("extra/own"), results[0]["own"])
    expected = torch.cat([torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * r for r in range(2)])
    assert_bit_exact(snapshot.read_object("extra/emb"), expected)


class DdpWrapped(torch.nn.Module):
    """What a DistributedDataParallel's state dict restores into: the module under ``module.``."""

    def __init__(self) -> None:
        super().__init__()
        self.module = _model(seed=7)


# --- detection and arguments -----------------------------------------------------------------


def _sources(tmp_path: Path) -> dict[str, Path]:
    from safetensors.torch import save_file

    state = _model().state_dict()
    torch.save({"model": state}, tmp_path / "a.pt")
    torch.save({"model": state}, tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)
    save_file(dict(state), str(tmp_path / "a.safetensors"))
    _write_sharded(tmp_path / "hf", state)
    _dcp_save({"model": state}, tmp_path / "dcp")
    return {
        "torch": tmp_path / "a.pt",
        "legacy": tmp_path / "legacy.bin",
        "safetensors": tmp_path / "a.safetensors",
        "hf": tmp_path / "hf",
        "dcp": tmp_path / "dcp",
    }


def test_detection(tmp_path: Path) -> None:
    from snapshotkit.convert._detect import detect

    sources = _sources(tmp_path)
    assert detect(sources["torch"]).source_format == "torch"
    assert detect(sources["legacy"]).source_format == "torch"
    assert detect(sources["safetensors"]).source_format == "safetensors"
    assert detect(sources["hf"]).path == sources["hf"] / "model.safetensors.index.json"
    assert detect(sources["dcp"]).source_format == "dcp"
    assert detect(sources["dcp"] / ".metadata").path == sources["dcp"]
    (tmp_path / "pt_dir").mkdir()
    torch.save({}, tmp_path / "pt_dir" / "only.ckpt")
    assert detect(tmp_path / "pt_dir").path == tmp_path / "pt_dir" / "only.ckpt"
    # --from picks among what a directory holds; a mismatch names what is there.
    torch.save({}, tmp_path / "hf" / "pytorch_model.bin")
    assert detect(tmp_path / "hf").source_format == "safetensors"
    assert detect(tmp_path / "hf", "torch").path == tmp_path / "hf" / "pytorch_model.bin"
    with pytest.raises(ImportSourceError, match=r"source='dcp' was given, but .* a torch.save file"):
        detect(sources["torch"], "dcp")


def test_unrecognized_sources_are_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ImportSourceError, match=r"not a checkpoint import recognizes .*beginning b'hello'"):
        import_snapshot(tmp_path / "notes.txt", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImportSourceError, match="an empty directory"):
        import_snapshot(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(ImportSourceError, match="nothing is at"):
        import_snapshot(tmp_path / "missing.pt", tmp_path / "out")
    with pytest.raises(ValueError):  # ImportSourceError is a ValueError
        import_snapshot(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "two").mkdir()
    torch.save({}, tmp_path / "two" / "a.pt")
    torch.save({}, tmp_path / "two" / "b.pt")
    with pytest.raises(ImportSourceError, match=r"2 torch checkpoints \(a.pt, b.pt\)"):
        import_snapshot(tmp_path / "two", tmp_path / "out")


def test_a_snapshot_is_not_imported(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "snap"), {"model": _model()})
    with pytest.raises(ImportSourceError, match="already is a snapshotkit snapshot"):
        import_snapshot(tmp_path / "snap", tmp_path / "out")


def test_argument_checks(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(1)}, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match=r"did you mean 'safetensors'"):
        import_snapshot(tmp_path / "w.pt", tmp_path / "out", source="safetensor")
    with pytest.raises(InvalidArgumentError):
        import_snapshot(None, tmp_path / "out")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        import_snapshot(tmp_path / "w.pt", tmp_path / "out", key=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key is empty"):
        import_snapshot(tmp_path / "w.pt", tmp_path / "out", key="")
    with pytest.raises(InvalidArgumentError):
        import_snapshot(tmp_path / "w.pt", tmp_path / "out", weights_only="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="local"):
        import_snapshot("s3://bucket/w.pt", tmp_path / "out")
    (tmp_path / "dir").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "dir" / "w.pt")
    with pytest.raises(ConfigError, match="inside src"):
        import_snapshot(tmp_path / "dir", tmp_path / "dir" / "out")
    import_snapshot(tmp_path / "w.pt", tmp_path / "out")
    with pytest.raises(SnapshotExistsError):
        import_snapshot(tmp_path / "w.pt", tmp_path / "out")


def test_import_to_another_store(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(3.0)}, tmp_path / "w.pt")
    report = import_snapshot(tmp_path / "w.pt", "memory://imported-w")
    assert report.path == "memory://imported-w"
    assert_bit_exact(Snapshot("memory://imported-w").read_object("model/w"), torch.arange(3.0))


# --- Snapshot(path) on a foreign checkpoint --------------------------------------------------


def _foreign(tmp_path: Path, torchsnapshot: ModuleType) -> dict[str, tuple[Path, str, str]]:
    """source -> (path, --from, what the message says was found)."""
    sources = _sources(tmp_path)
    torchsnapshot.Snapshot.take(str(tmp_path / "ts"), {"model": _model()})
    return {
        "torchsnapshot": (tmp_path / "ts", "torchsnapshot", "a torchsnapshot snapshot"),
        "dcp": (sources["dcp"], "dcp", "a DCP (torch.distributed.checkpoint) checkpoint"),
        "hf": (sources["hf"], "safetensors", "a Hugging Face sharded safetensors checkpoint"),
        "safetensors": (sources["safetensors"], "safetensors", "a safetensors file"),
        "torch": (sources["torch"], "torch", "a torch.save file"),
    }


def test_opening_a_foreign_checkpoint_says_what_it_is_and_how_to_convert_it(
    tmp_path: Path, torchsnapshot: ModuleType
) -> None:
    from snapshotkit.errors import ForeignCheckpointError

    for name, (path, source_format, found) in _foreign(tmp_path, torchsnapshot).items():
        with pytest.raises(ForeignCheckpointError) as info:
            Snapshot(str(path)).read_object("model/0.weight")
        error = info.value
        assert isinstance(error, SnapshotNotFoundError) and isinstance(error, FileNotFoundError), name
        assert error.source_format == source_format, name
        message = str(error)
        assert found in message, message
        command = f"snapshotkit import {path} OUT --from {source_format}"
        assert command in message, message
        assert "'model/0.weight'" in message, message
        assert "delete" not in message.lower(), message
        # The command it gives works.
        report = import_snapshot(path, tmp_path / f"converted-{name}", source=source_format)
        assert "model/0.weight" in report.logical_paths


def test_opening_an_interrupted_take_still_says_so(tmp_path: Path) -> None:
    from _snapshots import MANIFEST, take_basic

    from snapshotkit.errors import IncompleteSnapshotError

    take_basic(tmp_path / "snap")
    (tmp_path / "snap" / MANIFEST).unlink()
    with pytest.raises(IncompleteSnapshotError) as info:
        _ = Snapshot(str(tmp_path / "snap")).metadata
    message = str(info.value)
    assert "never committed" in message
    assert "earlier snapshot" in message
    assert "snapshotkit import" not in message


def test_report_is_a_frozen_value(tmp_path: Path) -> None:
    import dataclasses

    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    report = import_snapshot(tmp_path / "w.pt", tmp_path / "out")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.nbytes = 0  # type: ignore[misc]
    assert report.seconds > 0
    assert math.isfinite(report.seconds)
    assert isinstance(report, ImportReport)


def test_ordered_dicts_stay_ordered(tmp_path: Path) -> None:
    state = OrderedDict([("z", torch.ones(1)), ("a", {"k": 1})])
    torch.save({"state": state, "other": 1}, tmp_path / "o.pt")
    report = import_snapshot(tmp_path / "o.pt", tmp_path / "out")
    value = Snapshot(report.path).read_object("state")
    assert type(value) is OrderedDict and list(value) == ["z", "a"]
