"""Bad input gets a clear error from ``snapshotkit.errors``.

Every test checks three things: the snapshotkit class, the built-in class a caller unaware of
snapshotkit would catch, and that the message names the offending value and says what to do.
"""

from __future__ import annotations

import asyncio
import errno
import json
import pickle
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import snapshotkit
from snapshotkit import Snapshot, StateDict, errors
from snapshotkit.errors import (
    ChecksumMismatchError,
    ConfigError,
    IncompleteSnapshotError,
    IntegrityError,
    InvalidAppStateError,
    LogicalPathNotFoundError,
    ManifestError,
    SnapshotExistsError,
    SnapshotkitError,
    SnapshotNotFoundError,
    StateMismatchError,
    TruncatedDataError,
    UnsafeLocationError,
    UnsafeObjectError,
    UnsupportedFormatVersionError,
    UnsupportedValueError,
)
from snapshotkit.storage import FSStoragePlugin, register_storage_plugin

pytestmark = pytest.mark.usefixtures("clean_env")

MANIFEST = ".snapshot_metadata"
MIB = 1 << 20


# --------------------------------------------------------------------------------------------
# helpers


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer1 = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.layer1.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3))
            self.layer1.bias.copy_(torch.tensor([-1.0, 1.0]))


class Opaque:
    """A user class: storable with pickle, refused by ``weights_only=True`` loading."""

    def __init__(self, value: int) -> None:
        self.value = value


class ExplodingState:
    """A Stateful whose ``state_dict()`` fails."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def state_dict(self) -> dict[str, Any]:
        raise self.exc

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # pragma: no cover - never reached
        pass


def make_app_state() -> dict[str, Any]:
    return {
        "model": Net(),
        "extras": StateDict(step=3, w=torch.arange(8, dtype=torch.float32), name="run", history=[0.5, 0.25]),
    }


def take_basic(path: Path) -> Snapshot:
    return Snapshot.take(str(path), make_app_state())


def files_of(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (relative POSIX path -> bytes); ``{}`` when root is absent."""
    if not root.exists():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def data_objects(root: Path) -> list[str]:
    return sorted(name for name in files_of(root) if name.startswith("data/"))


def piece_of(snapshot_dir: Path, logical_path: str) -> tuple[Path, int, int]:
    """The data object file and byte range of the first piece of ``logical_path``."""
    entry = Snapshot(str(snapshot_dir)).get_manifest()[f"0/{logical_path}"]
    piece = entry.pieces[0] if hasattr(entry, "pieces") else entry.piece
    start, end = piece.byte_range
    return snapshot_dir / piece.location, start, end


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def load_manifest_json(snapshot_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((snapshot_dir / MANIFEST).read_text())
    return document


def write_manifest_json(snapshot_dir: Path, document: Any) -> None:
    (snapshot_dir / MANIFEST).write_text(json.dumps(document))


def assert_not_quoted(exc: BaseException) -> None:
    text = str(exc)
    assert text, "the error has no message"
    assert text[0] not in "'\"", f"str(exc) is wrapped in quotes: {text}"


def assert_nothing_committed(path: Path) -> None:
    """No snapshot opens at ``path`` and no file was left there."""
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(path)).metadata
    assert type(info.value) is SnapshotNotFoundError, f"leftovers at {path}: {info.value}"
    assert files_of(path) == {}


# --------------------------------------------------------------------------------------------
# the exception tree


def test_every_error_subclasses_snapshotkit_error_and_a_builtin() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert isinstance(cls, type), name
        assert issubclass(cls, SnapshotkitError), name
        if cls is SnapshotkitError:
            continue
        builtins_ = [
            base
            for base in cls.__mro__
            if not base.__module__.startswith("snapshotkit") and base not in (Exception, BaseException, object)
        ]
        assert builtins_, f"{name} derives from no built-in exception besides Exception"


def test_errors_all_is_sorted_and_complete() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }
    assert set(errors.__all__) == defined
    assert list(errors.__all__) == sorted(errors.__all__)


@pytest.mark.parametrize("name", errors.__all__)
def test_error_str_is_the_plain_message(name: str) -> None:
    cls = getattr(errors, name)
    exc = cls("something is wrong at 'x/y'; do this")
    assert str(exc) == "something is wrong at 'x/y'; do this"
    # Errors cross process boundaries (multiprocessing, async take): they must pickle.
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls
    assert str(again) == str(exc)


# --------------------------------------------------------------------------------------------
# opening and taking


def test_take_onto_existing_snapshot_raises_and_overwrites_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    other = {"extras": StateDict(w=torch.ones(1000), step=99)}

    with pytest.raises(SnapshotExistsError) as info:
        Snapshot.take(str(path), other)

    assert isinstance(info.value, FileExistsError)
    message = str(info.value)
    assert str(path) in message
    assert "never overwrites" in message
    assert "new path" in message
    assert files_of(path) == before


def test_take_onto_existing_snapshot_through_file_uri_raises(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = files_of(path)
    with pytest.raises(SnapshotExistsError):
        Snapshot.take(f"file://{path}", make_app_state())
    assert files_of(path) == before


def test_open_missing_path_raises_snapshot_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nothing-here"
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert type(exc) is SnapshotNotFoundError  # not IncompleteSnapshotError: nothing is there
    assert isinstance(exc, FileNotFoundError)
    assert str(path) in str(exc)
    assert "check the path" in str(exc)
    assert not path.exists()


def test_open_empty_directory_raises_snapshot_not_found(tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(tmp_path)).metadata
    assert type(info.value) is SnapshotNotFoundError


def test_restore_and_read_object_of_missing_path_raise_snapshot_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nothing-here"
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).restore({"extras": StateDict()})
    with pytest.raises(SnapshotNotFoundError):
        Snapshot(str(path)).read_object("extras/step")


def test_open_regular_file_raises_snapshot_not_found(tmp_path: Path) -> None:
    # A common slip: passing a torch.save file where a snapshot directory is expected.
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(SnapshotNotFoundError) as info:
        _ = Snapshot(str(path)).metadata
    assert isinstance(info.value, FileNotFoundError)
    assert str(path) in str(info.value)


def test_take_onto_regular_file_raises_snapshotkit_error_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a snapshot")
    with pytest.raises(SnapshotkitError) as info:
        take_basic(path)
    assert isinstance(info.value, OSError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b"not a snapshot"


def test_open_interrupted_take_raises_incomplete_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    (path / MANIFEST).unlink()  # what a take killed before its commit leaves behind
    assert data_objects(path)

    with pytest.raises(IncompleteSnapshotError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, SnapshotNotFoundError)
    assert isinstance(exc, FileNotFoundError)
    message = str(exc)
    assert str(path) in message
    assert "never committed" in message
    assert "earlier snapshot" in message


# --------------------------------------------------------------------------------------------
# app_state


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(torch.zeros(2), "Tensor"), (3, "int"), ("text", "str"), ({"a": 1}, "dict")],
    ids=["tensor", "int", "str", "plain-dict"],
)
def test_take_with_non_stateful_value_raises_invalid_app_state(tmp_path: Path, value: Any, type_name: str) -> None:
    path = tmp_path / "snap"
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(path), {"model": Net(), "weights": value})
    exc = info.value
    assert isinstance(exc, TypeError)
    message = str(exc)
    assert "'weights'" in message
    assert type_name in message
    assert "StateDict" in message
    assert files_of(path) == {}


def test_restore_with_non_stateful_value_raises_invalid_app_state(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot(str(path)).restore({"extras": torch.zeros(8)})
    assert isinstance(info.value, TypeError)
    assert "'extras'" in str(info.value)


@pytest.mark.parametrize(
    "app_state",
    [[Net()], Net(), None, "model"],
    ids=["list", "module", "none", "str"],
)
def test_take_with_non_dict_app_state_raises_invalid_app_state(tmp_path: Path, app_state: Any) -> None:
    path = tmp_path / "snap"
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(path), app_state)
    exc = info.value
    assert isinstance(exc, TypeError)
    assert type(app_state).__name__ in str(exc)
    assert "dict" in str(exc)
    assert files_of(path) == {}


@pytest.mark.parametrize("key", ["", 3], ids=["empty", "int"])
def test_take_with_bad_app_state_key_raises_invalid_app_state(tmp_path: Path, key: Any) -> None:
    with pytest.raises(InvalidAppStateError) as info:
        Snapshot.take(str(tmp_path / "snap"), {key: StateDict(a=1)})
    assert isinstance(info.value, TypeError)
    assert repr(key) in str(info.value)


# --------------------------------------------------------------------------------------------
# restore / read_object: what is asked for does not match what is stored


def test_restore_unknown_key_lists_the_keys_the_snapshot_has(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).restore({"optimizer": StateDict()})
    exc = info.value
    assert isinstance(exc, KeyError)
    assert_not_quoted(exc)
    message = str(exc)
    assert "'optimizer'" in message
    assert "'model'" in message
    assert "'extras'" in message
    assert "Remove it from app_state" in message


def test_restore_misspelled_key_suggests_the_close_match(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).restore({"modle": Net()})
    assert "close matches: 'model'" in str(info.value)


def test_restore_unknown_key_loads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    model = Net()
    with torch.no_grad():
        model.layer1.weight.zero_()
    with pytest.raises(LogicalPathNotFoundError):
        Snapshot(str(path)).restore({"model": model, "optimizer": StateDict()})
    assert torch.count_nonzero(model.layer1.weight) == 0


@pytest.mark.parametrize(
    ("destination", "words"),
    [
        (torch.zeros(4), ["shape [8]", "shape [4]"]),
        (torch.zeros(8, dtype=torch.float64), ["dtype float32", "dtype float64"]),
        (torch.zeros(2, 4), ["shape [8]", "shape [2, 4]"]),
    ],
    ids=["shape", "dtype", "rank"],
)
def test_strict_restore_of_mismatched_tensor_raises_state_mismatch(
    tmp_path: Path, destination: torch.Tensor, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    extras = StateDict(step=0, w=destination, name="")
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"extras": extras})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    for word in words:
        assert word in message
    assert "strict=False" in message
    assert extras["w"] is destination
    assert torch.count_nonzero(destination) == 0


@pytest.mark.parametrize(
    "destination",
    [torch.zeros(4), torch.zeros(8, dtype=torch.float64)],
    ids=["shape", "dtype"],
)
def test_non_strict_restore_of_mismatched_tensor_loads_a_fresh_tensor(
    tmp_path: Path, destination: torch.Tensor
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    extras = StateDict(step=0, w=destination, name="")
    Snapshot(str(path)).restore({"extras": extras}, strict=False)
    restored = extras["w"]
    assert restored is not destination
    assert restored.dtype == torch.float32
    assert torch.equal(restored, torch.arange(8, dtype=torch.float32))
    assert torch.count_nonzero(destination) == 0
    assert extras["step"] == 3
    assert extras["name"] == "run"


class RenamedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(3, 2)


class WiderNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("extra", torch.zeros(1))


@pytest.mark.parametrize(
    ("module", "words"),
    [
        (RenamedNet(), ["'model/first.weight'", "'model/layer1.weight'"]),
        (WiderNet(), ["'model/extra'"]),
    ],
    ids=["renamed", "extra-buffer"],
)
def test_strict_restore_of_module_with_different_keys_raises_state_mismatch(
    tmp_path: Path, module: torch.nn.Module, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).restore({"model": module})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'model'" in message
    for word in words:
        assert word in message
    assert "strict=False" in message
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} was modified by a refused restore"


def test_non_strict_restore_of_module_with_extra_buffer_loads_the_common_keys(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    module = WiderNet()
    with torch.no_grad():
        module.layer1.weight.zero_()
    Snapshot(str(path)).restore({"model": module}, strict=False)
    assert torch.equal(module.layer1.weight, Net().layer1.weight)
    assert torch.equal(module.extra, torch.zeros(1))


def test_read_object_of_unknown_path_lists_close_matches(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).read_object("model/layer1.wieght")
    exc = info.value
    assert isinstance(exc, KeyError)
    assert_not_quoted(exc)
    message = str(exc)
    assert "'model/layer1.wieght'" in message
    assert "'model/layer1.weight'" in message
    assert "get_manifest()" in message


def test_read_object_of_unknown_rank_prefixed_path_raises_logical_path_not_found(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(LogicalPathNotFoundError) as info:
        Snapshot(str(path)).read_object("7/model/layer1.weight")
    assert "'7/model/layer1.weight'" in str(info.value)


@pytest.mark.parametrize(
    ("obj_out", "words"),
    [
        (torch.empty(5), ["shape [2, 3]", "shape [5]"]),
        (torch.empty(2, 3, dtype=torch.float16), ["dtype float32", "dtype float16"]),
    ],
    ids=["shape", "dtype"],
)
def test_read_object_into_mismatched_obj_out_raises_state_mismatch(
    tmp_path: Path, obj_out: torch.Tensor, words: list[str]
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(StateMismatchError) as info:
        Snapshot(str(path)).read_object("model/layer1.weight", obj_out=obj_out)
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'model/layer1.weight'" in message
    for word in words:
        assert word in message


# --------------------------------------------------------------------------------------------
# corrupt data objects


def test_flipped_byte_raises_checksum_mismatch_on_restore(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start + 5)

    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, IntegrityError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "verify_checksums=False" in message


def test_flipped_byte_raises_checksum_mismatch_on_read_object(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "model/layer1.weight")
    flip_byte(location, start)

    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).read_object("model/layer1.weight")
    assert "'model/layer1.weight'" in str(info.value)
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("model/layer1.weight", obj_out=torch.empty(2, 3))
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("model")  # the subtree includes the corrupt leaf


def test_flipped_byte_in_one_tensor_does_not_affect_reading_another(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "model/layer1.weight")
    flip_byte(location, start)
    bias = Snapshot(str(path)).read_object("model/layer1.bias")
    assert torch.equal(bias, torch.tensor([-1.0, 1.0]))


def test_flipped_byte_loads_without_error_when_checksums_are_off(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start + 5)
    expected = torch.arange(8, dtype=torch.float32)

    extras = StateDict(step=0, w=torch.zeros(8), name="")
    Snapshot(str(path)).restore({"extras": extras}, verify_checksums=False)
    assert not torch.equal(extras["w"], expected)
    differing = (extras["w"].view(torch.uint8) != expected.view(torch.uint8)).nonzero().flatten().tolist()
    assert differing == [5]

    value = Snapshot(str(path)).read_object("extras/w", verify_checksums=False)
    assert torch.equal(value, extras["w"])


def test_flipped_byte_loads_without_error_when_checksums_are_off_by_env(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start)
    clean_env.setenv("SNAPSHOTKIT_VERIFY_CHECKSUMS", "0")
    value = Snapshot(str(path)).read_object("extras/w")
    assert not torch.equal(value, torch.arange(8, dtype=torch.float32))
    # The explicit argument wins over the environment.
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("extras/w", verify_checksums=True)


def test_flipped_byte_in_serialized_object_raises_checksum_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(shape=torch.Size([2, 3]))})
    location, start, end = piece_of(path, "extras/shape")
    flip_byte(location, (start + end) // 2)
    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).read_object("extras/shape")
    assert "'extras/shape'" in str(info.value)


def test_truncated_data_object_raises_truncated_data(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    location.write_bytes(location.read_bytes()[: start + 3])

    with pytest.raises(TruncatedDataError) as info:
        Snapshot(str(path)).read_object("extras/w")
    exc = info.value
    assert isinstance(exc, IntegrityError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "truncated" in message

    with pytest.raises(TruncatedDataError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    assert "'extras/w'" in str(info.value)


def test_deleted_data_object_raises_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, _, _ = piece_of(path, "extras/w")
    location.unlink()

    with pytest.raises(IntegrityError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "missing" in message

    with pytest.raises(IntegrityError):
        Snapshot(str(path)).read_object("extras/w")


# --------------------------------------------------------------------------------------------
# malformed manifests


@pytest.mark.parametrize(
    "text",
    [b"{not json: [unclosed", b"\xff\xfe\x00garbage\x00", b"", b"just some words", b"- a\n- b\n"],
    ids=["broken-yaml", "binary", "empty", "scalar", "list"],
)
def test_unparseable_manifest_raises_manifest_error(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    (path / MANIFEST).write_bytes(text)
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert type(exc) is ManifestError
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert MANIFEST in message
    assert "corrupt" in message


def _first_key(document: dict[str, Any], kind: str) -> str:
    return next(k for k, e in document["manifest"].items() if e["kind"] == kind)


def _del_header(name: str) -> Callable[[dict[str, Any]], str]:
    def mutate(document: dict[str, Any]) -> str:
        del document[name]
        return repr(name)

    return mutate


def _set_entry(kind: str, *keys: str, value: Any = None, delete: bool = False) -> Callable[[dict[str, Any]], str]:
    """Set (or delete) ``entry[keys[0]][keys[1]]...`` of the first entry of ``kind``."""

    def mutate(document: dict[str, Any]) -> str:
        key = _first_key(document, kind)
        target: Any = document["manifest"][key]
        for k in keys[:-1]:
            target = target[k]
        if delete:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
        return repr(key)

    return mutate


def _set_header(name: str, value: Any) -> Callable[[dict[str, Any]], str]:
    def mutate(document: dict[str, Any]) -> str:
        document[name] = value
        return name

    return mutate


def _bad_manifest_key(document: dict[str, Any]) -> str:
    key = _first_key(document, "tensor")
    document["manifest"]["model-without-rank"] = document["manifest"].pop(key)
    return "'model-without-rank'"


MALFORMED = {
    "missing-world-size": _del_header("world_size"),
    "missing-manifest": _del_header("manifest"),
    "missing-torch-version": _del_header("torch_version"),
    "missing-dtype": _set_entry("tensor", "dtype", delete=True),
    "missing-pieces": _set_entry("tensor", "pieces", delete=True),
    "missing-kind": _set_entry("tensor", "kind", delete=True),
    "missing-checksum": _set_entry("tensor", "pieces", 0, "checksum", delete=True),
    "unknown-kind": _set_entry("tensor", "kind", value="sharded_tensor_v9"),
    "unknown-serializer": _set_entry("tensor", "serializer", value="safetensors"),
    "unknown-checksum-algorithm": _set_entry("tensor", "pieces", 0, "checksum", value="md5:00ff"),
    "shape-as-string": _set_entry("tensor", "shape", value="2x3"),
    "negative-dim": _set_entry("tensor", "shape", value=[-1, 3]),
    "byte-range-strings": _set_entry("tensor", "pieces", 0, "byte_range", value=["0", "24"]),
    "byte-range-reversed": _set_entry("tensor", "pieces", 0, "byte_range", value=[24, 0]),
    "byte-range-float": _set_entry("tensor", "pieces", 0, "byte_range", value=[0.0, 24.0]),
    "pieces-not-list": _set_entry("tensor", "pieces", value={"location": "data/0_00000"}),
    "int-holding-string": _set_entry("primitive", "value", value="three"),
    "dict-keys-not-list": _set_entry("dict", "keys", value="abc"),
    "world-size-string": _set_header("world_size", "1"),
    "world-size-zero": _set_header("world_size", 0),
    "format-version-string": _set_header("format_version", "1"),
    "format-version-zero": _set_header("format_version", 0),
    "format-name": _set_header("format", "torchsnapshot"),
    "manifest-not-mapping": _set_header("manifest", ["0/model"]),
    "manifest-key-without-rank": _bad_manifest_key,
    "replicated-not-bool": _set_entry("tensor", "replicated", value="yes"),
    "list-length-negative": _set_entry("list", "length", value=-1),
    "primitive-unknown-type": _set_entry("primitive", "type", value="decimal"),
    "dict-key-float": _set_entry("dict", "keys", value=[1.5]),
    "world-size-bool": _set_header("world_size", True),
    "format-version-bool": _set_header("format_version", True),
    "byte-range-bools": _set_entry("tensor", "pieces", 0, "byte_range", value=[False, True]),
    "checksum-not-hex": _set_entry("tensor", "pieces", 0, "checksum", value="crc32c:zzzzzzzz"),
}


@pytest.mark.parametrize("mutate", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_manifest_raises_manifest_error(tmp_path: Path, mutate: Callable[[dict[str, Any]], str]) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    named = mutate(document)
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert not isinstance(exc, (UnsupportedFormatVersionError, UnsafeLocationError))
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert MANIFEST in message
    assert named in message, f"{named} is not named in: {message}"


def test_unknown_entry_kind_is_rejected_by_restore_and_read_object(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["manifest"]["0/extras/future"] = {"kind": "sharded_tensor_v9", "shards": []}
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        Snapshot(str(path)).restore({"model": Net()})  # not even the untouched keys load
    assert "'sharded_tensor_v9'" in str(info.value)
    assert "'0/extras/future'" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).read_object("model/layer1.weight")


def test_truncated_manifest_raises_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    text = (path / MANIFEST).read_bytes()
    (path / MANIFEST).write_bytes(text[: len(text) // 2])
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    assert MANIFEST in str(info.value)


def test_duplicate_manifest_entry_raises_manifest_error(tmp_path: Path) -> None:
    # docs/format.md 8.1: readers should reject duplicate member names rather than keep one silently.
    path = tmp_path / "snap"
    take_basic(path)
    text = (path / MANIFEST).read_text()
    start = text.index('"0/extras/w":')
    line = text[start : text.index("\n", start)].rstrip(",")
    impostor = line.replace('"shape":[8]', '"shape":[2,4]')
    assert impostor != line
    (path / MANIFEST).write_text(text[:start] + impostor + ",\n" + text[start:])
    with pytest.raises(ManifestError) as info:
        _ = Snapshot(str(path)).metadata
    assert "'0/extras/w'" in str(info.value)


def test_container_naming_a_missing_child_raises_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["manifest"]["0/extras"]["keys"].append("ghost")
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:  # at the latest when the container is rebuilt
        Snapshot(str(path)).restore({"extras": StateDict()})
    assert "extras/ghost" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).read_object("extras")


def test_raw_pieces_of_the_wrong_length_raise_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    piece = document["manifest"]["0/extras/w"]["pieces"][0]
    piece["byte_range"][1] -= 1
    write_manifest_json(path, document)

    with pytest.raises(ManifestError) as info:
        Snapshot(str(path)).read_object("extras/w")
    assert "'extras/w'" in str(info.value)
    with pytest.raises(ManifestError):
        Snapshot(str(path)).restore({"extras": StateDict()})


def test_newer_format_version_raises_unsupported_format_version(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    document["format_version"] = 3
    document["snapshotkit_version"] = "9.0.0"
    document["manifest"]["0/extras/future"] = {"kind": "kind_from_the_future"}
    write_manifest_json(path, document)

    with pytest.raises(UnsupportedFormatVersionError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, ManifestError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "format version 3" in message
    assert "'9.0.0'" in message
    assert "upgrade" in message.lower()
    assert "pip install -U snapshotkit" in message


# --------------------------------------------------------------------------------------------
# locations that leave the snapshot


class ReadSpy:
    """Records every data-object location the fs plugin is asked to read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.locations: list[str] = []
        original_read_into = FSStoragePlugin.read_into
        original_read = FSStoragePlugin.read
        spy = self

        async def read_into(self: FSStoragePlugin, location: str, start: int, buffers: Sequence[memoryview]) -> None:
            spy.locations.append(location)
            await original_read_into(self, location, start, buffers)

        async def read(self: FSStoragePlugin, location: str, byte_range: Any = None) -> Any:
            if location != MANIFEST:
                spy.locations.append(location)
            return await original_read(self, location, byte_range)

        monkeypatch.setattr(FSStoragePlugin, "read_into", read_into)
        monkeypatch.setattr(FSStoragePlugin, "read", read)


@pytest.mark.parametrize(
    "location",
    ["../outside", "/etc/passwd", "data/../../x", "data/./0_00000", "data//0_00000", "C:/x", "data\\0_00000", ""],
    ids=["parent", "absolute", "dotdot-inside", "dot", "empty-component", "drive", "backslash", "empty"],
)
def test_location_leaving_the_snapshot_raises_unsafe_location_before_any_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    entry = document["manifest"]["0/extras/w"]
    real = path / entry["pieces"][0]["location"]
    # Put the real bytes where an unsafe reader would look, so following the location would
    # silently "work" (checksums included) instead of failing for another reason.
    for target in (tmp_path / "outside", tmp_path / "x"):
        target.write_bytes(real.read_bytes())
    for piece in entry["pieces"]:
        piece["location"] = location
    write_manifest_json(path, document)
    spy = ReadSpy(monkeypatch)

    with pytest.raises(UnsafeLocationError) as info:
        _ = Snapshot(str(path)).metadata
    exc = info.value
    assert isinstance(exc, ManifestError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert repr(location) in message
    assert MANIFEST in message

    with pytest.raises(UnsafeLocationError):
        Snapshot(str(path)).restore({"model": Net(), "extras": StateDict()})
    with pytest.raises(UnsafeLocationError):
        Snapshot(str(path)).read_object("model/layer1.weight")  # even a path with safe pieces
    assert spy.locations == []


def test_manifest_location_cannot_point_at_the_manifest(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    document = load_manifest_json(path)
    for piece in document["manifest"]["0/extras/w"]["pieces"]:
        piece["location"] = MANIFEST
    write_manifest_json(path, document)
    with pytest.raises(UnsafeLocationError):
        _ = Snapshot(str(path)).metadata


# --------------------------------------------------------------------------------------------
# values that cannot be stored or loaded


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(lambda x: x, "function"), (threading.Lock(), "lock")],
    ids=["lambda", "lock"],
)
def test_unpicklable_value_raises_unsupported_value_and_writes_nothing(
    tmp_path: Path, value: Any, type_name: str
) -> None:
    path = tmp_path / "snap"
    app_state = {"model": Net(), "extras": StateDict(step=1, nested={"callback": value})}
    with pytest.raises(UnsupportedValueError) as info:
        Snapshot.take(str(path), app_state)
    exc = info.value
    assert isinstance(exc, TypeError)
    message = str(exc)
    assert "'extras/nested/callback'" in message
    assert type_name in message
    assert "picklable" in message
    assert not path.exists()
    assert_nothing_committed(path)


def test_meta_tensor_raises_unsupported_value_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    with pytest.raises(UnsupportedValueError) as info:
        Snapshot.take(str(path), {"extras": StateDict(w=torch.empty(3, device="meta"))})
    assert isinstance(info.value, TypeError)
    assert "'extras/w'" in str(info.value)
    assert "meta" in str(info.value)
    assert_nothing_committed(path)


def test_custom_object_is_refused_by_weights_only_restore(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(obj=Opaque(7), step=1)})

    with pytest.raises(UnsafeObjectError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, pickle.UnpicklingError)
    message = str(exc)
    assert "'extras/obj'" in message
    assert "weights_only=False" in message
    assert "trust" in message

    with pytest.raises(UnsafeObjectError):
        Snapshot(str(path)).read_object("extras/obj")


def test_custom_object_loads_with_weights_only_false(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(obj=Opaque(7), step=1)})

    extras = StateDict()
    Snapshot(str(path)).restore({"extras": extras}, weights_only=False)
    assert isinstance(extras["obj"], Opaque)
    assert extras["obj"].value == 7
    assert extras["step"] == 1

    value = Snapshot(str(path)).read_object("extras/obj", weights_only=False)
    assert isinstance(value, Opaque)
    assert value.value == 7


# --------------------------------------------------------------------------------------------
# takes that fail half-way leave nothing behind


class FaultyFS(FSStoragePlugin):
    """The fs plugin, except that the ``fail_at``-th data-object write (and every later one) fails.

    The failing write waits until every earlier write has completed, so exactly ``fail_at - 1``
    data objects are on disk when the take fails, whatever the I/O concurrency.
    """

    def __init__(self, root: str, fail_at: int, make_exc: Callable[[], BaseException]) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.make_exc = make_exc
        self.started = 0
        self.completed: list[str] = []
        self._earlier_done: asyncio.Event | None = None

    async def write(self, location: str, data: Any) -> None:
        if not location.startswith("data/"):
            await super().write(location, data)
            return
        if self._earlier_done is None:
            self._earlier_done = asyncio.Event()
            if self.fail_at == 1:
                self._earlier_done.set()
        self.started += 1
        if self.started >= self.fail_at:
            await self._earlier_done.wait()
            raise self.make_exc()
        await super().write(location, data)
        self.completed.append(location)
        if len(self.completed) == self.fail_at - 1:
            self._earlier_done.set()


@pytest.fixture
def faulty_scheme() -> Iterator[Callable[[int, Callable[[], BaseException]], list[FaultyFS]]]:
    """Register ``faulty://``; calling the fixture sets which write fails and returns the plugins made."""
    from snapshotkit.storage import _registry

    made: list[FaultyFS] = []

    def configure(fail_at: int, make_exc: Callable[[], BaseException]) -> list[FaultyFS]:
        def factory(root: str, storage_options: Mapping[str, Any]) -> FaultyFS:
            plugin = FaultyFS(root, fail_at, make_exc)
            made.append(plugin)
            return plugin

        register_storage_plugin("faulty", factory)
        return made

    yield configure
    _registry._registered.pop("faulty", None)


def big_app_state(count: int = 6) -> dict[str, Any]:
    """``count`` tensors of 1 MiB each: with 1 MiB data objects, one data object per tensor."""
    return {
        "model": Net(),
        "extras": StateDict({f"t{i}": torch.full((MIB // 4,), float(i)) for i in range(count)}),
    }


@pytest.mark.parametrize("io_concurrency", ["1", "4"])
@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_take_failing_half_way_deletes_what_it_wrote(
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    faulty_scheme: Callable[[int, Callable[[], BaseException]], list[FaultyFS]],
    fail_at: int,
    io_concurrency: str,
) -> None:
    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    clean_env.setenv("SNAPSHOTKIT_IO_CONCURRENCY", io_concurrency)
    plugins = faulty_scheme(fail_at, lambda: OSError(errno.EIO, "injected write failure"))
    path = tmp_path / "snap"

    with pytest.raises(OSError, match="injected write failure") as info:
        Snapshot.take(f"faulty://{path}", big_app_state())
    assert isinstance(info.value, errors.StorageError)
    assert str(path) in str(info.value)

    writer = next(p for p in plugins if p.started)
    assert len(writer.completed) == fail_at - 1  # the failure really came half-way
    assert_nothing_committed(path)
    with pytest.raises(SnapshotNotFoundError):
        _ = Snapshot(f"faulty://{path}").metadata


def test_take_failing_half_way_into_existing_directory_keeps_other_files(
    tmp_path: Path,
    clean_env: pytest.MonkeyPatch,
    faulty_scheme: Callable[[int, Callable[[], BaseException]], list[FaultyFS]],
) -> None:
    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    faulty_scheme(3, lambda: OSError(errno.ENOSPC, "injected: no space left"))
    path = tmp_path / "snap"
    path.mkdir()
    (path / "README").write_text("the user's file")

    with pytest.raises(OSError, match="no space left"):
        Snapshot.take(f"faulty://{path}", big_app_state())
    assert files_of(path) == {"README": b"the user's file"}


class StallingFS(FSStoragePlugin):
    """The fs plugin, except that the ``stall_at``-th data-object write waits until it is cancelled.

    ``stalled`` is set when that write starts.
    """

    def __init__(self, root: str, stall_at: int, stalled: threading.Event) -> None:
        super().__init__(root)
        self.stall_at = stall_at
        self.started = 0
        self.stalled = stalled

    async def write(self, location: str, data: Any) -> None:
        if location.startswith("data/"):
            self.started += 1
            if self.started == self.stall_at:
                self.stalled.set()
                await asyncio.Event().wait()  # until cancelled
        await super().write(location, data)


def test_ctrl_c_during_take_deletes_what_it_wrote_before_raising(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    from snapshotkit.storage import _registry

    clean_env.setenv("SNAPSHOTKIT_DATA_OBJECT_BYTES", str(MIB))
    clean_env.setenv("SNAPSHOTKIT_IO_CONCURRENCY", "1")
    stalled = threading.Event()
    plugins: list[StallingFS] = []

    def factory(root: str, storage_options: Mapping[str, Any]) -> StallingFS:
        plugins.append(StallingFS(root, 3, stalled))
        return plugins[-1]

    register_storage_plugin("stalling", factory)
    armed = True

    def press_ctrl_c() -> None:
        stalled.wait()
        if armed:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    interrupter = threading.Thread(target=press_ctrl_c)
    interrupter.start()
    path = tmp_path / "snap"
    try:
        with pytest.raises(KeyboardInterrupt):
            Snapshot.take(f"stalling://{path}", big_app_state())
        # Looked at the moment the interrupt arrives: the take must have cleaned up first.
        left_at_raise = data_objects(path)
    finally:
        armed = False
        stalled.set()
        interrupter.join()
        _registry._registered.pop("stalling", None)

    assert max(p.started for p in plugins) == 3  # two data objects were written, the third stalled
    assert left_at_raise == [], "Snapshot.take re-raised KeyboardInterrupt before deleting what it wrote"
    assert_nothing_committed(path)


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), RuntimeError("state_dict exploded")],
    ids=["keyboard-interrupt", "runtime-error"],
)
def test_take_whose_state_dict_raises_writes_nothing(tmp_path: Path, exc: BaseException) -> None:
    path = tmp_path / "snap"
    app_state = {**big_app_state(2), "zz_last": ExplodingState(exc)}
    with pytest.raises(type(exc)):
        Snapshot.take(str(path), app_state)
    assert not path.exists()
    assert_nothing_committed(path)


def test_snapshotkit_still_works_after_failed_takes(tmp_path: Path) -> None:
    # The failures above must not leave the shared event loop broken.
    path = tmp_path / "snap"
    take_basic(path)
    assert Snapshot(str(path)).read_object("extras/step") == 3


# --------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "abc"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "-1"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "0"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "1.5GB"),
        ("SNAPSHOTKIT_CHUNK_BYTES", "lots"),
        ("SNAPSHOTKIT_DATA_OBJECT_BYTES", "0"),
        ("SNAPSHOTKIT_IO_CONCURRENCY", "four"),
        ("SNAPSHOTKIT_VERIFY_CHECKSUMS", "maybe"),
    ],
)
def test_invalid_environment_variable_raises_config_error(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    clean_env.setenv(variable, value)

    calls: list[Callable[[], Any]] = [
        lambda: Snapshot.take(str(tmp_path / "other"), make_app_state()),
        lambda: Snapshot(str(path)).restore({"extras": StateDict()}),
        lambda: Snapshot(str(path)).read_object("extras/w"),
    ]
    for call in calls:
        with pytest.raises(ConfigError) as info:
            call()
        exc = info.value
        assert isinstance(exc, ValueError)
        message = str(exc)
        assert variable in message
        assert repr(value) in message
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("budget", [0, -5, 1.5, "1024", True], ids=["zero", "negative", "float", "str", "bool"])
def test_invalid_memory_budget_argument_raises_config_error(tmp_path: Path, budget: Any) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(ConfigError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()}, memory_budget_bytes=budget)
    assert isinstance(info.value, ValueError)
    assert "memory_budget_bytes" in str(info.value)
    assert repr(budget) in str(info.value)
    with pytest.raises(ConfigError):
        Snapshot.take(str(tmp_path / "other"), make_app_state(), memory_budget_bytes=budget)
    assert not (tmp_path / "other").exists()


def test_unknown_storage_scheme_raises_with_known_schemes(tmp_path: Path) -> None:
    with pytest.raises(errors.UnknownStorageSchemeError) as info:
        Snapshot.take("nosuchscheme://bucket/snap", make_app_state())
    exc = info.value
    assert isinstance(exc, ValueError)
    assert isinstance(exc, errors.StorageError)
    message = str(exc)
    assert "'nosuchscheme'" in message
    assert "file" in message
    assert "memory" in message
    assert "register_storage_plugin" in message


def test_public_api_exposes_errors_module() -> None:
    assert snapshotkit.errors is errors
