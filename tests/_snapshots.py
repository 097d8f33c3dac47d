"""Helpers shared by the test modules: a small app_state, taking it, and poking at the files of a snapshot.

``tests/`` is on ``sys.path`` (pytest's rootdir insertion), so any test module can
``from _snapshots import ...``; ``tests/conftest.py`` registers it for assertion rewriting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import SnapshotNotFoundError
from snapshotkit.manifest import SnapshotMetadata, decode_document, encode_document

MANIFEST = ".snapshot_metadata"


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


def plant_snapshot_at(root: Path) -> None:
    """Put a snapshot at the existing directory ``root`` itself, as ``Snapshot.take(root)`` into a
    manager's root wrote one before such a take was refused: taken beside it, then moved in."""
    aside = root.parent / f"{root.name}-aside"
    Snapshot.take(str(aside), {"stray": StateDict(x=torch.arange(3.0))})
    (aside / "data").rename(root / "data")
    (aside / MANIFEST).rename(root / MANIFEST)
    aside.rmdir()


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


def rewrite_as_v4(snapshot_dir: Path) -> None:
    """Rewrite the manifest of the snapshot at ``snapshot_dir`` as format version 4 (one JSON entry
    per manifest key), the same entries and header: takes write version 5, and version 4 must stay
    read. A version 1 to 4 manifest is left as it is."""
    metadata = SnapshotMetadata.from_text((snapshot_dir / MANIFEST).read_bytes())
    if metadata.format_version == 5:
        v4 = dataclasses.replace(metadata, format_version=4, manifest=dict(metadata.manifest))
        (snapshot_dir / MANIFEST).write_bytes(v4.to_bytes())


def load_manifest_json(snapshot_dir: Path) -> dict[str, Any]:
    """The raw manifest document, its integrity line verified and removed, of the snapshot first
    rewritten as format version 4 (:func:`rewrite_as_v4`), whose per-entry JSON these tests edit."""
    rewrite_as_v4(snapshot_dir)
    return decode_document((snapshot_dir / MANIFEST).read_bytes())


def write_manifest_json(snapshot_dir: Path, document: Any) -> None:
    """Write ``document`` as the manifest with a valid integrity line (the public codec)."""
    (snapshot_dir / MANIFEST).write_bytes(encode_document(document))


def reseal_manifest(snapshot_dir: Path) -> None:
    """Recompute the integrity line of an edited manifest, following docs/format.md 2.1 alone:
    the first line is ``{"integrity": "sha256:<hex>",`` and the digest covers every byte after it."""
    data = (snapshot_dir / MANIFEST).read_bytes()
    first, newline, body = data.partition(b"\n")
    assert first.startswith(b'{"integrity": "sha256:') and newline
    digest = hashlib.sha256(body).hexdigest().encode()
    (snapshot_dir / MANIFEST).write_bytes(b'{"integrity": "sha256:' + digest + b'",\n' + body)


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


def nested(depth: int) -> dict[str, Any]:
    """A dict nested ``depth`` levels deep (``{"d": {"d": ... {"leaf": 1}}}``)."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth - 1):
        node["d"] = {}
        node = node["d"]
    node["leaf"] = 1
    return root


def depth_of(value: dict[str, Any]) -> int:
    """The depth of a :func:`nested` dict, or -1 if it is not one."""
    depth = 1
    while "d" in value:
        value, depth = value["d"], depth + 1
    return depth if value == {"leaf": 1} else -1


#: The golden snapshots and the scripts that built them.
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


def load_golden_builder(name: str) -> Any:
    """The module ``tests/golden/<name>.py`` (a golden snapshot's builder: its expected values)."""
    spec = importlib.util.spec_from_file_location(name, GOLDEN_DIR / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Equal value, exact type, exact bits."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        assert actual.contiguous().view(torch.uint8).tolist() == expected.contiguous().view(torch.uint8).tolist(), where
        return
    assert type(actual) is type(expected), f"{where}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}/{index}")
    elif isinstance(expected, float):
        assert float.hex(actual) == float.hex(expected), where
    else:
        assert actual == expected, where
