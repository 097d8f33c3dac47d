"""``import snapshotkit as torchsnapshot`` is enough for code written against torchsnapshot 0.1.0.

Every call here is spelled the way torchsnapshot's documentation spells it (positional
arguments included); the signature tests compare ours with the installed torchsnapshot 0.1.0
and skip when it is not importable. No torchsnapshot code is copied or run to produce data.
"""

from __future__ import annotations

import inspect
import warnings
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import snapshotkit as torchsnapshot
from snapshotkit.errors import (
    AppStateKeyNotFoundError,
    InvalidArgumentError,
    LogicalPathNotFoundError,
    UnsupportedValueError,
)
from snapshotkit.manifest import DictEntry, ListEntry, ObjectEntry, Piece, PrimitiveEntry, TensorEntry
from snapshotkit.storage import ByteRange, FSStoragePlugin

pytestmark = pytest.mark.usefixtures("clean_env")


def _reference() -> ModuleType:
    """The installed torchsnapshot (its import warns about torch.jit.script), or skip."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("torchsnapshot")


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def _assert_state_equal(a: Any, b: Any) -> None:
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ------------------------------------------------------------------ calls as torchsnapshot spells them


def test_positional_take_restore_and_read_object(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    model, progress = _model(), torchsnapshot.StateDict(step=7)
    app_state = {"model": model, "progress": progress}
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    snapshot = torchsnapshot.Snapshot.take(path, app_state, None, None, None)  # pg, replicated, storage_options

    with torch.no_grad():
        model.weight.zero_()
    progress["step"] = 0
    torchsnapshot.Snapshot(path, None, None).restore(app_state)  # Snapshot(path, pg, storage_options)
    _assert_state_equal(model.state_dict(), saved)
    assert progress["step"] == 7

    out = torch.empty(3, 4)
    assert snapshot.read_object("0/model/weight", out, 1 << 20) is out  # path, obj_out, memory_budget_bytes
    assert torch.equal(out, saved["weight"])
    assert snapshot.read_object("0/progress/step") == 7


def test_keyword_take_with_replicated_glob(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    model = _model()
    torchsnapshot.Snapshot.take(path=path, app_state={"model": model}, pg=None, replicated=["**"], storage_options=None)
    manifest = torchsnapshot.Snapshot(path=path).get_manifest()
    assert manifest["0/model/weight"].replicated
    fresh = _model(seed=1)
    torchsnapshot.Snapshot(path=path, pg=None, storage_options=None).restore(app_state={"model": fresh})
    _assert_state_equal(fresh.state_dict(), model.state_dict())


def test_positional_async_take_wait_and_done(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    model = _model()
    pending = torchsnapshot.Snapshot.async_take(path, {"model": model}, None, None, None)
    assert isinstance(pending, torchsnapshot.PendingSnapshot)
    assert pending.path == path and pending.pg is None
    snapshot = pending.wait()
    assert pending.done()
    assert isinstance(snapshot, torchsnapshot.Snapshot)
    assert torch.equal(snapshot.read_object("0/model/bias"), model.bias.detach())


def test_metadata_fields(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    torchsnapshot.Snapshot.take(path, {"model": _model()})
    metadata = torchsnapshot.Snapshot(path).metadata
    assert metadata.version == torchsnapshot.__version__
    assert metadata.world_size == 1
    assert set(metadata.manifest) == {"0/model", "0/model/weight", "0/model/bias"}


def test_top_level_names_of_torchsnapshot_are_exported() -> None:
    reference = _reference()
    assert set(reference.__all__) <= set(torchsnapshot.__all__)
    assert {"PendingSnapshot", "RNGState", "Snapshot", "StateDict", "Stateful", "__version__"} <= set(
        torchsnapshot.__all__
    )


# ------------------------------------------------------------------ get_state_dict_for_key


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every data-object read of the local plugin, as ``(location, start, end)``."""
    reads: list[tuple[str, int, int]] = []
    read, read_into = FSStoragePlugin.read, FSStoragePlugin.read_into

    async def counting_read(self: FSStoragePlugin, location: str, byte_range: ByteRange | None = None) -> Any:
        data = await read(self, location, byte_range)
        if location.startswith("data/"):
            start = byte_range.start if byte_range is not None else 0
            reads.append((location, start, start + len(data)))
        return data

    async def counting_read_into(self: FSStoragePlugin, location: str, start: int, buffers: Any) -> None:
        await read_into(self, location, start, buffers)
        reads.append((location, start, start + sum(len(b) for b in buffers)))

    monkeypatch.setattr(FSStoragePlugin, "read", counting_read)
    monkeypatch.setattr(FSStoragePlugin, "read_into", counting_read_into)
    return reads


def test_get_state_dict_for_key_reads_only_that_key(tmp_path: Path, counted_reads: list[tuple[str, int, int]]) -> None:
    path = str(tmp_path / "snap")
    model = _model()
    other = torchsnapshot.StateDict(table=torch.arange(10_000.0), step=3)
    torchsnapshot.Snapshot.take(path, {"model": model, "other": other})
    snapshot = torchsnapshot.Snapshot(path)
    manifest = snapshot.get_manifest()
    elsewhere = [
        p for k, e in manifest.items() if k.startswith("0/other/") and isinstance(e, TensorEntry) for p in e.pieces
    ]
    assert elsewhere

    state = snapshot.get_state_dict_for_key("model")
    assert isinstance(state, OrderedDict)
    _assert_state_equal(state, model.state_dict())
    assert counted_reads
    for location, start, end in counted_reads:
        for piece in elsewhere:
            overlap = piece.location == location and start < piece.byte_range[1] and piece.byte_range[0] < end
            assert not overlap, f"read {location} [{start}, {end}) touches another key's piece"

    assert snapshot.get_state_dict_for_key("other")["step"] == 3
    assert model.weight.requires_grad  # nothing was loaded into the module


def test_get_state_dict_for_key_with_special_characters_and_errors(tmp_path: Path) -> None:
    path = str(tmp_path / "snap")
    torchsnapshot.Snapshot.take(path, {"a/b%": torchsnapshot.StateDict(x=1), "model": _model()})
    snapshot = torchsnapshot.Snapshot(path)
    assert snapshot.get_state_dict_for_key("a/b%") == {"x": 1}
    with pytest.raises(AppStateKeyNotFoundError, match=r"'modle'.*'model'"):
        snapshot.get_state_dict_for_key("modle")
    with pytest.raises(AppStateKeyNotFoundError, match=r"'a/b'.*'a/b%'"):  # keys shown as passed, not escaped
        snapshot.get_state_dict_for_key("a/b")
    with pytest.raises(InvalidArgumentError, match="app_state key as a str"):
        snapshot.get_state_dict_for_key(0)  # type: ignore[arg-type]


def test_a_missing_key_is_the_assertion_error_torchsnapshot_raises(tmp_path: Path) -> None:
    # torchsnapshot's own test expects AssertionError from get_state_dict_for_key("invalid_key"),
    # and restore of a key the snapshot lacks raises one too; before, only a KeyError was raised.
    path = str(tmp_path / "snap")
    torchsnapshot.Snapshot.take(path, {"my_module": _model()})
    snapshot = torchsnapshot.Snapshot(path)
    with pytest.raises(AssertionError, match="'invalid_key' is not in the snapshot") as info:
        snapshot.get_state_dict_for_key("invalid_key")
    assert isinstance(info.value, KeyError) and isinstance(info.value, LogicalPathNotFoundError)
    with pytest.raises(AssertionError, match="'other' is not in the snapshot") as info:
        snapshot.restore({"my_module": _model(), "other": torchsnapshot.StateDict(x=1)})
    assert isinstance(info.value, KeyError)


def test_read_object_ignores_an_obj_out_that_is_not_a_tensor(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # As torchsnapshot's own test_read_object: read_object("0/state/foo", 777) returns 42.
    state = torchsnapshot.StateDict(foo=42, bar=torch.randn(20, 20))
    snapshot = torchsnapshot.Snapshot.take(path=str(tmp_path / "snap"), app_state={"state": state})
    assert snapshot.read_object("0/state/foo", 777) == 42
    assert torch.equal(snapshot.read_object("0/state/bar", "not a tensor"), state["bar"])
    assert [r.levelname for r in caplog.records if r.name == "snapshotkit.restore"] == ["WARNING", "WARNING"]


# ------------------------------------------------------------------ manifest entries


def test_manifest_entries_answer_to_torchsnapshot_names(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    extra = torchsnapshot.StateDict(
        step=3, lr=0.1, name="run", flag=True, blob=b"\x00\x01", items=[1, 2], seen={1, 2}, w=torch.ones(2, 3)
    )
    torchsnapshot.Snapshot.take(str(path), {"model": _model(), "extra": extra})
    manifest = torchsnapshot.Snapshot(str(path)).get_manifest()

    assert manifest["0/model"].type == "OrderedDict"
    assert manifest["0/extra"].type == "dict"
    assert manifest["0/extra"].keys == ("step", "lr", "name", "flag", "blob", "items", "seen", "w")
    assert manifest["0/extra/items"].type == "list"
    primitives = {name: manifest[f"0/extra/{name}"] for name in ("step", "lr", "name", "flag", "blob")}
    assert {n: e.type for n, e in primitives.items()} == {
        "step": "int",
        "lr": "float",
        "name": "str",
        "flag": "bool",
        "blob": "bytes",
    }
    assert {n: e.get_value() for n, e in primitives.items()} == {
        "step": 3,
        "lr": 0.1,
        "name": "run",
        "flag": True,
        "blob": b"\x00\x01",
    }
    assert primitives["lr"].readable == "0.1"
    assert primitives["step"].readable is None
    assert not primitives["step"].replicated

    seen = manifest["0/extra/seen"]
    assert isinstance(seen, ObjectEntry)
    assert (seen.type, seen.serializer, seen.obj_type) == ("object", "torch_save", "builtins.set")
    assert seen.location == seen.piece.location

    tensor = manifest["0/extra/w"]
    assert isinstance(tensor, TensorEntry)
    assert (tensor.type, tensor.dtype, tensor.shape, tensor.serializer, tensor.replicated) == (
        "Tensor",
        "float32",
        (2, 3),
        "raw",
        False,
    )
    start, end = tensor.byte_range
    assert tensor.byte_range_tuple == (start, end)
    raw = (path / tensor.location).read_bytes()[start:end]  # the bytes are where the entry says
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(2, 3), extra["w"])


@pytest.mark.parametrize("count", [0, 2])
def test_a_tensor_not_in_one_piece_has_no_location(count: int) -> None:
    # like torchsnapshot's ChunkedTensorEntry, which has no location or byte_range either
    pieces = tuple(Piece("data/0_00000_0", (i * 8, i * 8 + 8), "crc32c:00000000") for i in range(count))
    entry = TensorEntry("float32", (count * 2,), "raw", pieces)
    with pytest.raises(AttributeError, match=f"stored in {count} pieces.*entry.pieces"):
        _ = entry.location
    assert not hasattr(entry, "byte_range")
    assert not hasattr(entry, "byte_range_tuple")
    assert entry.type == "Tensor"


@pytest.mark.parametrize(
    ("reference_class", "names", "example"),
    [
        (
            "TensorEntry",
            ["type", "location", "serializer", "dtype", "shape", "replicated", "byte_range", "byte_range_tuple"],
            "0/s/t",
        ),
        ("ObjectEntry", ["type", "location", "serializer", "obj_type", "replicated"], "0/s/o"),
        ("PrimitiveEntry", ["type", "replicated", "readable", "get_value"], "0/s/n"),
        ("DictEntry", ["type", "keys"], "0/s"),
        ("OrderedDictEntry", ["type", "keys"], "0/m"),
        ("ListEntry", ["type"], "0/s/l"),
        ("SnapshotMetadata", ["version", "world_size", "manifest"], None),
    ],
)
def test_entry_attribute_names_are_torchsnapshots(
    tmp_path: Path, reference_class: str, names: list[str], example: str | None
) -> None:
    reference = getattr(_reference().manifest, reference_class)
    known = set(getattr(reference, "__dataclass_fields__", {})) | set(dir(reference))
    assert set(names) <= known, set(names) - known  # the names really are torchsnapshot's

    state = torchsnapshot.StateDict(t=torch.ones(2), o={1}, n=5, l=[1])
    snapshot = torchsnapshot.Snapshot.take(str(tmp_path / "snap"), {"s": state, "m": _model()})
    ours = snapshot.metadata if example is None else snapshot.get_manifest()[example]
    assert all(hasattr(ours, name) for name in names), [n for n in names if not hasattr(ours, n)]


def test_entry_types_are_the_classes_users_check() -> None:
    assert DictEntry(("a",), ordered=True).type == "OrderedDict"
    assert ListEntry(2).type == "list"
    assert PrimitiveEntry.of(None).type == "none"


# ------------------------------------------------------------------ _custom_tensor_prepare_func


class _ToBFloat16:
    """Stores float32 tensors as bfloat16; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
        self.calls.append((path, tracing))
        if tensor.dtype != torch.float32:
            return tensor
        if tracing:  # only the dtype and shape count: a cheap stand-in will do
            return torch.empty(tensor.shape, dtype=torch.bfloat16, device="meta")
        return tensor.to(torch.bfloat16)


@pytest.mark.parametrize("how", ["take", "async_take"])
def test_prepare_func_stores_float32_as_bfloat16(tmp_path: Path, how: str) -> None:
    path = str(tmp_path / "snap")
    weights = torch.randn(5, 3)
    state = torchsnapshot.StateDict(w=weights, steps=torch.arange(3), lr=0.5)
    prepare = _ToBFloat16()
    if how == "take":
        snapshot = torchsnapshot.Snapshot.take(path, {"s": state}, None, None, None, prepare)
    else:
        snapshot = torchsnapshot.Snapshot.async_take(path, {"s": state}, _custom_tensor_prepare_func=prepare).wait()

    assert prepare.calls == [("s/w", True), ("s/w", False), ("s/steps", True), ("s/steps", False)]
    manifest = snapshot.get_manifest()
    assert manifest["0/s/w"].dtype == "bfloat16"
    assert manifest["0/s/steps"].dtype == "int64"
    assert manifest["0/s/w"].nbytes == weights.numel() * 2
    expected = weights.to(torch.bfloat16)
    assert torch.equal(snapshot.read_object("0/s/w"), expected)

    destination = torch.empty(5, 3, dtype=torch.bfloat16)
    fresh = torchsnapshot.StateDict(w=destination, steps=torch.zeros(3, dtype=torch.int64), lr=0.0)
    torchsnapshot.Snapshot(path).restore({"s": fresh})
    assert fresh["w"] is destination and torch.equal(destination, expected)
    assert torch.equal(fresh["steps"], torch.arange(3)) and fresh["lr"] == 0.5


def test_prepare_func_may_quantize_for_storage(tmp_path: Path) -> None:
    x = torch.linspace(-1, 1, 21)

    def quantize(path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
        return torch.quantize_per_tensor(tensor, 0.01, 0, torch.qint8)

    snapshot = torchsnapshot.Snapshot.take(
        str(tmp_path / "snap"), {"s": torchsnapshot.StateDict(x=x)}, None, None, None, quantize
    )
    assert snapshot.get_manifest()["0/s/x"].serializer == "torch_save"
    stored = snapshot.read_object("0/s/x")
    assert stored.dtype == torch.qint8
    assert torch.allclose(stored.dequantize(), x, atol=0.005)


def test_prepare_func_sees_only_selected_leaves(tmp_path: Path) -> None:
    prepare = _ToBFloat16()
    state = torchsnapshot.StateDict(a=torch.ones(2), b=torch.ones(2))
    torchsnapshot.Snapshot.take(
        str(tmp_path / "snap"), {"s": state}, _custom_tensor_prepare_func=prepare, include=["s/a"]
    )
    assert prepare.calls == [("s/a", True), ("s/a", False)]


def _bad_results() -> dict[str, Any]:
    def wrong_shape(path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
        return tensor.flatten()

    def not_a_tensor(path: str, tensor: torch.Tensor, tracing: bool) -> Any:
        return tensor.tolist()

    def traced_dtype_lies(path: str, tensor: torch.Tensor, tracing: bool) -> torch.Tensor:
        return tensor.half() if tracing else tensor.bfloat16()

    return {
        "wrong-shape": (wrong_shape, "changed the shape of the tensor at 's/w' from \\[2, 2\\] to \\[4\\]"),
        "not-a-tensor": (not_a_tensor, "returned a list for the tensor at 's/w'"),
        "traced-dtype-lies": (traced_dtype_lies, "float16 for 's/w' with tracing=True but bfloat16"),
    }


@pytest.mark.parametrize("how", ["take", "async_take"])
@pytest.mark.parametrize("case", sorted(_bad_results()))
def test_a_bad_prepare_result_is_refused_before_anything_is_written(tmp_path: Path, how: str, case: str) -> None:
    func, message = _bad_results()[case]
    path = tmp_path / "snap"
    state = {"s": torchsnapshot.StateDict(w=torch.ones(2, 2))}
    take = getattr(torchsnapshot.Snapshot, how)
    with pytest.raises(UnsupportedValueError, match=message):
        take(str(path), state, _custom_tensor_prepare_func=func)
    assert not path.exists()


@pytest.mark.parametrize("how", ["take", "async_take"])
def test_a_prepare_func_that_is_not_callable_is_refused_before_anything_is_written(tmp_path: Path, how: str) -> None:
    path = tmp_path / "snap"
    take = getattr(torchsnapshot.Snapshot, how)
    with pytest.raises(InvalidArgumentError, match="_custom_tensor_prepare_func must be a callable"):
        take(str(path), {"s": torchsnapshot.StateDict(w=torch.ones(2))}, _custom_tensor_prepare_func="bfloat16")
    assert not path.exists()


# ------------------------------------------------------------------ signatures against torchsnapshot 0.1.0

_COMPARED = [
    ("Snapshot", "__init__"),
    ("Snapshot", "take"),
    ("Snapshot", "async_take"),
    ("Snapshot", "restore"),
    ("Snapshot", "read_object"),
    ("Snapshot", "get_manifest"),
    ("PendingSnapshot", "wait"),
    ("PendingSnapshot", "done"),
    ("StateDict", "__init__"),
    ("StateDict", "state_dict"),
    ("StateDict", "load_state_dict"),
    ("RNGState", "state_dict"),
    ("RNGState", "load_state_dict"),
    ("Stateful", "state_dict"),
    ("Stateful", "load_state_dict"),
]


def _reference_class(name: str) -> Any:
    reference = _reference()
    return getattr(reference, name, None) or getattr(reference.snapshot, name)


def test_every_public_method_of_torchsnapshot_is_compared() -> None:
    compared = set(_COMPARED)
    for owner in ("Snapshot", "PendingSnapshot", "RNGState", "Stateful"):
        cls = _reference_class(owner)
        public = {n for n, v in vars(cls).items() if not n.startswith("_") and callable(getattr(cls, n))}
        assert {(owner, n) for n in public} <= compared, public
    assert isinstance(inspect.getattr_static(torchsnapshot.Snapshot, "metadata"), property)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
#: Our positional parameters after all of torchsnapshot 0.1.0's: ``restore(app_state, strict)`` as in
#: torchsnapshot's later builds, and ``wait(timeout)`` as in ``concurrent.futures``.
_LATER_POSITIONAL = {("Snapshot", "restore"): "strict", ("PendingSnapshot", "wait"): "timeout"}


@pytest.mark.parametrize(("owner", "method"), _COMPARED, ids=[f"{o}.{m}" for o, m in _COMPARED])
def test_our_signature_accepts_every_call_torchsnapshots_accepts(owner: str, method: str) -> None:
    theirs = inspect.signature(getattr(_reference_class(owner), method))
    ours = inspect.signature(getattr(getattr(torchsnapshot, owner), method))
    their_params, our_params = list(theirs.parameters.values()), list(ours.parameters.values())
    for index, param in enumerate(their_params):
        if param.kind in _POSITIONAL:
            assert index < len(our_params), f"{param.name} (position {index}) is missing"
            mine = our_params[index]
            assert mine.name == param.name, f"position {index} is {mine.name!r}, torchsnapshot has {param.name!r}"
            assert mine.kind in (param.kind, inspect.Parameter.POSITIONAL_OR_KEYWORD), (param.name, mine.kind)
        else:
            assert param.name in ours.parameters, f"{param.name} is missing"
            mine = ours.parameters[param.name]
            assert mine.kind == param.kind or param.kind == inspect.Parameter.KEYWORD_ONLY
        if param.default is not inspect.Parameter.empty:
            assert mine.default == param.default, (param.name, mine.default, param.default)
    extra = [p for p in our_params if p.name not in theirs.parameters]
    for param in extra:  # ours only: optional and keyword-only (a later torchsnapshot's positional ones excepted)
        assert param.default is not inspect.Parameter.empty, param.name
        if param.name != _LATER_POSITIONAL.get((owner, method)):
            assert param.kind == inspect.Parameter.KEYWORD_ONLY, param.name


def test_get_state_dict_for_key_takes_the_key_like_later_torchsnapshot() -> None:
    # Not in 0.1.0; the nightly builds have get_state_dict_for_key(self, key).
    names = list(inspect.signature(torchsnapshot.Snapshot.get_state_dict_for_key).parameters)
    assert names[:2] == ["self", "key"]
