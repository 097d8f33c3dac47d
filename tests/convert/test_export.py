"""``export_snapshot``: every output is loaded back with the other library's own API, bit for bit.

torch: ``torch.load(f, weights_only=True)``; safetensors: ``safetensors.torch.load_file`` (and a
module's ``load_state_dict``); DCP: ``torch.distributed.checkpoint.load`` in one process. Plus the
argument checks, the no-overwrite and no-partial-output rules, and corrupt sources.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from _snapshots import Opaque, flip_byte, piece_of

from snapshotkit import Snapshot, StateDict
from snapshotkit.convert import ExportReport, export_snapshot
from snapshotkit.convert._to_safetensors import DTYPES
from snapshotkit.errors import (
    ChecksumMismatchError,
    ConfigError,
    ExportExistsError,
    IntegrityError,
    InvalidArgumentError,
    SnapshotNotFoundError,
    TruncatedDataError,
)

pytestmark = [
    pytest.mark.usefixtures("clean_env"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),  # dcp.load in one process
]

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "v2" / "sharded"


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _net(seed)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optim.step()
    return model, optim


def _extras(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "step": 7,
        "lr": 0.1,
        "name": "run-\u00e9",
        "done": False,
        "note": None,
        "salt": b"\x00\xff",
        "big": 2**200,
        "history": [0.5, torch.arange(3)],
        "pair": (1, torch.ones(2, 2)),
        "od": collections.OrderedDict([("x", "three"), ("k", torch.zeros(1, dtype=torch.int16))]),
        "tags": {"a"},
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "half": torch.randn(3, dtype=torch.bfloat16),
        "tied": model[0].weight,
        "nothing": {},
        "a/b": torch.full((2,), 3.0),
    }


@pytest.fixture
def taken(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A snapshot of a model, its Adam optimizer and assorted state; and the state dicts it holds."""
    model, optim = _trained()
    extras = _extras(model)
    unsafe = StateDict({**extras, "opaque": Opaque(5)})
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"model": model, "optim": optim, "extras": unsafe})
    # the top level is in the manifest's order: app_state names sorted
    return path, {"extras": extras, "model": model.state_dict(), "optim": optim.state_dict()}


def _bits(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Equal values of equal types, containers in the same order, tensors bit for bit."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape)), where
        assert _bits(got) == _bits(want), where
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{where}/{i}")
    else:
        assert got == want, where


def _nothing_left(directory: Path, *expected: str) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(expected)


# ----------------------------------------------------------------------------------------- torch


def test_torch_export_loads_with_weights_only_bit_exact(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    out = tmp_path / "state.pt"
    report = export_snapshot(path, out, to="torch")
    got = torch.load(out, weights_only=True)
    assert_same(got, want)
    # tied weights stay tied, as restore keeps them
    assert got["extras"]["tied"].untyped_storage().data_ptr() == got["model"]["0.weight"].untyped_storage().data_ptr()
    assert zipfile.ZipFile(out).testzip() is None  # every record's zip CRC is right
    assert report.format == "torch" and report.files == (str(out),)
    assert report.bytes_written == out.stat().st_size
    assert report.tensors_written == 4 + 12 + 8  # model, optimizer (3 per parameter), extras (the tied one too)
    assert [p for p, _ in report.skipped] == ["extras/opaque"]
    assert "weights_only" in dict(report.skipped)["extras/opaque"]
    _nothing_left(tmp_path, "snap", "state.pt")


def test_torch_export_with_weights_only_false_includes_any_object(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, _ = taken
    report = export_snapshot(path, tmp_path / "all.pt", to="torch", weights_only=False)
    assert report.skipped == ()
    assert torch.load(tmp_path / "all.pt", weights_only=False)["extras"]["opaque"].value == 5


def test_torch_export_of_a_prefix_loads_into_the_module(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    export_snapshot(path, tmp_path / "model.pt", to="torch", select="model/**", strip_prefix="model/")
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert isinstance(state, collections.OrderedDict)
    fresh = _net(seed=1)
    fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), want["model"])


def test_torch_export_keeps_quantized_and_refuses_dtypes_torch_save_cannot_store(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.0, 0.5, 1.0]), 0.5, 0, torch.qint8)
    int4 = torch.zeros(4, dtype=torch.uint8).view(torch.int4)
    Snapshot.take(str(tmp_path / "s"), {"x": StateDict(q=q, int4=int4, pair=(int4, 1), ok=torch.ones(1))})
    report = export_snapshot(tmp_path / "s", tmp_path / "x.pt", to="torch")
    got = torch.load(tmp_path / "x.pt", weights_only=True)
    assert torch.equal(got["x"]["q"].int_repr(), q.int_repr()) and got["x"]["q"].q_scale() == 0.5
    assert list(got["x"]) == ["q", "ok"]
    skipped = dict(report.skipped)
    assert "torch.save cannot store" in skipped["x/int4"]
    assert "torch.save cannot store" in skipped["x/pair/0"]
    assert "list or tuple" in skipped["x/pair/1"]  # the tuple cannot be rebuilt without its element


@pytest.mark.parametrize("dtype", [*sorted(DTYPES), "complex32", "complex128", "float8_e8m0fnu", "bits16"])
def test_torch_export_every_dtype_bit_exact(tmp_path: Path, dtype: str) -> None:
    torch_dtype = getattr(torch, dtype)
    raw = torch.randint(0, 256, (2, 3 * torch_dtype.itemsize), dtype=torch.uint8)
    value = raw.view(torch_dtype)
    Snapshot.take(str(tmp_path / "s"), {"x": StateDict(v=value)})
    export_snapshot(tmp_path / "s", tmp_path / "x.pt", to="torch")
    assert_same(torch.load(tmp_path / "x.pt", weights_only=True)["x"]["v"], value)


# ----------------------------------------------------------------------------------- safetensors


def _header(path: Path) -> tuple[dict[str, Any], int]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + length]
    assert text.rstrip(b" ") == text.rstrip() and json.loads(text)  # padded with spaces only
    return json.loads(text), 8 + length


def test_safetensors_export_loads_into_the_module(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    out = tmp_path / "model.safetensors"
    report = export_snapshot(path, out, to="safetensors", select="model/**", strip_prefix="model/")
    fresh = _net(seed=1)
    fresh.load_state_dict(safetensors.torch.load_file(out))  # strict: exactly the module's keys
    assert_same(fresh.state_dict(), want["model"])
    assert report.skipped == () and report.tensors_written == 4
    header, data_start = _header(out)
    assert data_start % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] == out.stat().st_size - data_start


def test_safetensors_export_lists_every_non_tensor_as_skipped(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, want = taken
    out = tmp_path / "all.safetensors"
    report = export_snapshot(path, out, to="safetensors")
    loaded = safetensors.torch.load_file(out)
    assert_same(loaded["model.0.weight"], want["model"]["0.weight"])
    assert_same(loaded["optim.state.0.exp_avg"], want["optim"]["state"][0]["exp_avg"])
    assert_same(loaded["extras.pair.1"], want["extras"]["pair"][1])
    assert_same(loaded["extras.a/b"], want["extras"]["a/b"])  # keys are unescaped
    assert_same(loaded["extras.empty"], want["extras"]["empty"])
    assert_same(loaded["extras.scalar"], want["extras"]["scalar"])
    skipped = dict(report.skipped)
    for name in ("step", "lr", "name", "done", "note", "salt", "big", "tags", "opaque", "nothing", "history/0"):
        assert "not a tensor" in skipped[f"extras/{name}"], name
    assert "not a tensor" in skipped["optim/param_groups/0/lr"]
    assert len(loaded) == report.tensors_written == 4 + 12 + 8
    assert set(skipped).isdisjoint(p.replace("/", ".") for p in loaded)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_safetensors_dtypes_load_bit_exact(tmp_path: Path, dtype: str) -> None:
    torch_dtype = getattr(torch, dtype)
    value = torch.randint(0, 256, (3, 5 * torch_dtype.itemsize), dtype=torch.uint8).view(torch_dtype)
    Snapshot.take(str(tmp_path / "s"), {"x": StateDict(v=value)})
    export_snapshot(tmp_path / "s", tmp_path / "x.safetensors", to="safetensors")
    header, _ = _header(tmp_path / "x.safetensors")
    assert header["x.v"]["dtype"] == DTYPES[dtype]
    assert_same(safetensors.torch.load_file(tmp_path / "x.safetensors")["x.v"], value)


def test_safetensors_skips_what_it_cannot_hold(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.0, 0.5]), 0.5, 0, torch.qint8)
    state = StateDict(
        c128=torch.zeros(2, dtype=torch.complex128),
        e8m0=torch.zeros(2, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        q=q,
        sparse=torch.eye(2).to_sparse(),
        ok=torch.ones(2),
    )
    Snapshot.take(str(tmp_path / "s"), {"x": state})
    report = export_snapshot(tmp_path / "s", tmp_path / "x.safetensors", to="safetensors")
    skipped = dict(report.skipped)
    assert "dtype complex128 has no safetensors dtype" in skipped["x/c128"]
    assert "dtype float8_e8m0fnu has no safetensors dtype" in skipped["x/e8m0"]
    assert "torch.save" in skipped["x/q"] and "torch.save" in skipped["x/sparse"]
    assert list(safetensors.torch.load_file(tmp_path / "x.safetensors")) == ["x.ok"]


def test_safetensors_sharded_in_the_hugging_face_layout(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    out = tmp_path / "hf"
    report = export_snapshot(path, out, to="safetensors", select="model/**", strip_prefix="model/", max_shard_bytes=50)
    names = sorted(p.name for p in out.iterdir())
    count = len(names) - 1
    assert count > 1 and names[-1] == "model.safetensors.index.json"
    assert names[:-1] == [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in want["model"].values())
    assert sorted(index["weight_map"]) == sorted(want["model"])
    merged: dict[str, torch.Tensor] = {}
    for name in sorted(set(index["weight_map"].values())):  # what Hugging Face loaders do with the index
        shard = safetensors.torch.load_file(out / name)
        assert {k for k, v in index["weight_map"].items() if v == name} == set(shard)
        merged.update(shard)
    fresh = _net(seed=1)
    fresh.load_state_dict(merged)
    assert_same(fresh.state_dict(), want["model"])
    assert report.files == tuple(str(out / n) for n in names)
    # one file is enough: model.safetensors alone, as Hugging Face writes an unsharded model
    one = tmp_path / "one"
    export_snapshot(path, one, to="safetensors", select="model/**", strip_prefix="model/", max_shard_bytes=1 << 20)
    assert [p.name for p in one.iterdir()] == ["model.safetensors"]


def test_safetensors_streams_a_tensor_larger_than_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from snapshotkit.convert import _export_source as _source

    big = torch.randn(256, 1024)  # 1 MiB, one piece
    small = {f"small{i}": torch.full((1000 + i,), float(i)) for i in range(20)}  # windows of several pieces
    Snapshot.take(str(tmp_path / "s"), {"x": StateDict(big=big, **small)})
    budgets: list[Any] = []

    class Recording(_source.MemoryBudget):
        def __init__(self, total_bytes: int) -> None:
            super().__init__(total_bytes)
            budgets.append(self)

    monkeypatch.setattr(_source, "MemoryBudget", Recording)
    export_snapshot(tmp_path / "s", tmp_path / "x.safetensors", to="safetensors", memory_budget_bytes=64 << 10)
    loaded = safetensors.torch.load_file(tmp_path / "x.safetensors")
    assert_same(loaded["x.big"], big)
    for name, value in small.items():
        assert_same(loaded[f"x.{name}"], value)
    # the 1 MiB piece went through bounce buffers of at most the budget (sub-ranges), never whole
    assert max(b.peak_reserved_bytes for b in budgets) in range(1, (64 << 10) + 1)


def test_two_paths_giving_one_key_are_refused(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "s"), {"x": StateDict({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}})})
    with pytest.raises(ConfigError, match=r"both give the safetensors key 'x\.a\.b'"):
        export_snapshot(tmp_path / "s", tmp_path / "x.safetensors", to="safetensors")
    _nothing_left(tmp_path, "s")


# ------------------------------------------------------------------------------------------- DCP


def _dcp_destination(want: dict[str, Any]) -> dict[str, Any]:
    """Fresh objects of the same structure: zeroed tensors, other primitives."""

    def fresh(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.zeros_like(value.detach())
        if isinstance(value, dict):
            return type(value)((k, fresh(v)) for k, v in value.items())
        if isinstance(value, list):
            return [fresh(v) for v in value]
        return None

    return {name: fresh(value) for name, value in want.items()}


def test_dcp_export_loads_in_one_process(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    out = tmp_path / "ckpt"
    report = export_snapshot(path, out, to="dcp")
    destination = _dcp_destination(want)
    dcp.load(destination, checkpoint_id=str(out))
    assert_same(destination["model"], want["model"])
    assert_same(destination["optim"], want["optim"])
    assert_same(destination["extras"], want["extras"])
    assert [p for p, _ in report.skipped] == ["extras/opaque"]
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp"]  # fits the budget: one file
    assert dcp.FileSystemReader(str(out)).read_metadata().storage_meta.checkpoint_id == out


def test_dcp_export_above_the_budget_writes_a_file_per_value(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, want = taken
    out = tmp_path / "ckpt"
    export_snapshot(path, out, to="dcp", select="model/**", strip_prefix="model/", memory_budget_bytes=64)
    assert len(list(out.glob("*.distcp"))) == 4
    fresh = _net(seed=1)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=str(out))
    assert_same(state, want["model"])


def test_dcp_refuses_a_list_at_the_top(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = taken
    with pytest.raises(ConfigError, match="names a list"):
        export_snapshot(path, tmp_path / "ckpt", to="dcp", select="extras/history/**", strip_prefix="extras/history/")
    _nothing_left(tmp_path, "snap")


# ---------------------------------------------------------------------------- sharded tensors


def _golden_expected() -> dict[str, torch.Tensor]:
    return {
        "rows": torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6) / 4,
        "columns": torch.arange(4 * 7, dtype=torch.int64).reshape(4, 7) - 10,
        "everywhere": torch.tensor([1.5, 2.5, 3.5]),
    }


def test_sharded_tensors_of_a_two_rank_snapshot(tmp_path: Path) -> None:
    want = _golden_expected()
    for budget in (None, 256):  # everything in one window; pieces spread over many windows
        out = tmp_path / f"t-{budget}.safetensors"
        export_snapshot(GOLDEN_V2, out, to="safetensors", select="tables/**", memory_budget_bytes=budget)
        loaded = safetensors.torch.load_file(out)
        for name, value in want.items():  # rows: by dim 0 in several pieces; columns: by dim 1
            assert_same(loaded[f"tables.{name}"], value)
    export_snapshot(GOLDEN_V2, tmp_path / "t.pt", to="torch")
    got = torch.load(tmp_path / "t.pt", weights_only=True)
    assert_same(got["tables"], want)
    assert got["progress"] == {"step": 100, "tag": "rank 0"}  # rank 0's own state
    export_snapshot(GOLDEN_V2, tmp_path / "ckpt", to="dcp", select="tables/**")
    chunks = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata["tables.rows"].chunks
    assert [(list(c.offsets), list(c.sizes)) for c in chunks] == [([0, 0], [3, 6]), ([3, 0], [2, 6])]  # shards kept
    destination = {"tables": {name: torch.zeros_like(value) for name, value in want.items()}}
    dcp.load(destination, checkpoint_id=str(tmp_path / "ckpt"))
    assert_same(destination["tables"], want)


# ------------------------------------------------------------------------------- select, strip


def test_select_several_patterns_and_the_list_rule(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, want = taken
    report = export_snapshot(path, tmp_path / "x.pt", to="torch", select=["extras/step", "extras/history/1"])
    assert torch.load(tmp_path / "x.pt", weights_only=True) == {"extras": {"step": 7}}
    assert [p for p, _ in report.skipped] == ["extras/history/1"]
    assert "list or tuple" in report.skipped[0][1]
    export_snapshot(path, tmp_path / "x.safetensors", to="safetensors", select=["extras/history/1"])
    loaded = safetensors.torch.load_file(tmp_path / "x.safetensors")
    assert_same(loaded["extras.history.1"], want["extras"]["history"][1])


@pytest.mark.parametrize("to", ["torch", "safetensors", "dcp"])
def test_a_selected_path_without_the_prefix_is_refused(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path, to: str
) -> None:
    path, _ = taken
    with pytest.raises(ConfigError, match="does not start with strip_prefix='model/'"):
        export_snapshot(path, tmp_path / "out", to=to, select=["model/**", "extras/step"], strip_prefix="model/")
    _nothing_left(tmp_path, "snap")


@pytest.mark.parametrize("to", ["torch", "dcp"])
def test_nested_formats_strip_a_container_only(taken: tuple[Path, dict[str, Any]], tmp_path: Path, to: str) -> None:
    path, _ = taken
    with pytest.raises(ConfigError, match="must be the logical path of a container"):
        export_snapshot(path, tmp_path / "out", to=to, select="model/0.*", strip_prefix="model/0.")
    with pytest.raises(ConfigError, match="is a leaf"):
        export_snapshot(path, tmp_path / "out", to=to, select="extras/step", strip_prefix="extras/step/")


def test_selecting_nothing_is_refused_with_close_matches(taken: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = taken
    with pytest.raises(ConfigError, match=r"matches no logical path.*close matches: 'model"):
        export_snapshot(path, tmp_path / "out", to="torch", select="modle/**")
    with pytest.raises(ConfigError, match="nothing to export to safetensors"):
        export_snapshot(path, tmp_path / "out", to="safetensors", select="extras/step")
    _nothing_left(tmp_path, "snap")


# ------------------------------------------------------------------ arguments, dst, failures


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"to": "onnx"}, ConfigError, "one of \\['dcp', 'safetensors', 'torch'\\]"),
        ({"to": None}, InvalidArgumentError, "to= names the output format"),
        ({"to": "torch", "select": 3}, InvalidArgumentError, "select= takes a glob pattern"),
        ({"to": "torch", "select": ["model/**", 3]}, InvalidArgumentError, "patterns must be str"),
        ({"to": "torch", "select": []}, ConfigError, "selects nothing"),
        ({"to": "torch", "strip_prefix": ""}, ConfigError, "strips nothing"),
        ({"to": "torch", "strip_prefix": b"model/"}, InvalidArgumentError, "strip_prefix must be a str"),
        ({"to": "safetensors", "max_shard_bytes": 0}, ConfigError, "must be positive"),
        ({"to": "safetensors", "max_shard_bytes": True}, InvalidArgumentError, "must be an int"),
        ({"to": "torch", "max_shard_bytes": 100}, ConfigError, "safetensors exports only"),
        ({"to": "torch", "weights_only": "yes"}, InvalidArgumentError, "weights_only"),
        ({"to": "torch", "storage_options": [1]}, InvalidArgumentError, "storage_options"),
        ({"to": "torch", "memory_budget_bytes": 0}, ConfigError, "memory_budget_bytes"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path, kwargs: dict[str, Any], error: type, match: str
) -> None:
    path, _ = taken
    with pytest.raises(error, match=match):
        export_snapshot(path, tmp_path / "out", **kwargs)
    _nothing_left(tmp_path, "snap")


@pytest.mark.parametrize(
    ("dst", "error", "match"),
    [
        (None, InvalidArgumentError, "dst must be a local path"),
        ("", ConfigError, "names no path"),
        ("s3://bucket/model.safetensors", ConfigError, "is a URI"),
        ("missing/dir/model.pt", ConfigError, "does not exist; create it first"),
    ],
)
def test_bad_destinations_are_refused(
    taken: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dst: Any,
    error: type,
    match: str,
) -> None:
    path, _ = taken
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=match):
        export_snapshot(path, dst, to="torch")
    _nothing_left(tmp_path, "snap")


@pytest.mark.parametrize("existing", ["file", "directory", "empty directory"])
@pytest.mark.parametrize("to", ["torch", "safetensors", "dcp"])
def test_an_existing_destination_is_never_overwritten(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path, existing: str, to: str
) -> None:
    path, _ = taken
    out = tmp_path / "out"
    if existing == "file":
        out.write_bytes(b"keep me")
    else:
        out.mkdir()
        if existing == "directory":
            (out / "keep").write_bytes(b"keep me")
    with pytest.raises(ExportExistsError, match=f"{str(out)!r} already exists") as info:
        export_snapshot(path, out, to=to)
    assert isinstance(info.value, FileExistsError)
    assert (
        out.read_bytes() == b"keep me"
        if existing == "file"
        else sorted(os.listdir(out)) == (["keep"] if existing == "directory" else [])
    )
    _nothing_left(tmp_path, "snap", "out")


@pytest.mark.parametrize("to", ["torch", "safetensors", "dcp"])
def test_a_corrupt_snapshot_fails_and_leaves_no_output(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path, to: str
) -> None:
    path, _ = taken
    data_object, start, _ = piece_of(path, "model/2.bias")
    flip_byte(data_object, start)
    with pytest.raises(IntegrityError) as info:
        export_snapshot(path, tmp_path / "out", to=to)
    assert isinstance(info.value, ChecksumMismatchError)
    assert "'model/2.bias'" in str(info.value)
    _nothing_left(tmp_path, "snap")


def test_a_truncated_snapshot_fails_before_writing_tensor_data(
    taken: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, _ = taken
    data_object, _, _ = piece_of(path, "model/2.bias")
    data_object.write_bytes(data_object.read_bytes()[:-8])
    with pytest.raises(TruncatedDataError):
        export_snapshot(path, tmp_path / "out", to="safetensors")
    _nothing_left(tmp_path, "snap")


def test_a_missing_snapshot_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError):
        export_snapshot(tmp_path / "nothing", tmp_path / "out.pt", to="torch")
    assert list(tmp_path.iterdir()) == []


def test_export_from_another_store(tmp_path: Path) -> None:
    model = _net()
    Snapshot.take("memory://export-test/snap", {"model": model})
    report = export_snapshot("memory://export-test/snap", tmp_path / "m.safetensors", to="safetensors")
    assert isinstance(report, ExportReport) and report.tensors_written == 4
    assert_same(safetensors.torch.load_file(tmp_path / "m.safetensors")["model.0.weight"], model[0].weight)
