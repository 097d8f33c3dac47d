"""``snapshotkit._format.dtypes``: the raw dtypes of docs/format.md 4.1, checked before any byte is read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshots import load_manifest_json, take_basic, write_manifest_json

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit.errors import ManifestError

pytestmark = pytest.mark.usefixtures("clean_env")

QUANTIZED = {"qint8", "quint8", "qint32", "quint4x2", "quint2x4"}


def test_the_table_is_every_non_quantized_torch_dtype_with_torchs_itemsize() -> None:
    names = {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert set(RAW_ITEMSIZE) == set(names) - QUANTIZED
    assert {name: names[name].itemsize for name in RAW_ITEMSIZE} == RAW_ITEMSIZE


def _edit_w(path: Path, **fields: Any) -> None:
    document = load_manifest_json(path)
    document["manifest"]["0/extras/w"].update(fields)
    write_manifest_json(path, document)


CRAFTED: dict[str, tuple[dict[str, Any], str]] = {
    # 32 bytes of float32 [8] relabelled: the same byte count, a dtype raw storage cannot hold.
    "quint4x2": ({"dtype": "quint4x2", "shape": [32]}, "cannot be stored raw"),
    "quint2x4": ({"dtype": "quint2x4", "shape": [32]}, "cannot be stored raw"),
    "qint32": ({"dtype": "qint32", "shape": [8]}, "cannot be stored raw"),
    "unknown": ({"dtype": "float128", "shape": [2]}, "cannot be stored raw"),
    "not-a-name": ({"dtype": "Float32 ", "shape": [8]}, "not a torch dtype name"),
    "huge-dim": ({"shape": [2**63]}, "more elements than torch can index"),
    "huge-product": ({"shape": [2**32, 2**32]}, "more elements than torch can index"),
    "huge-with-a-zero": ({"shape": [2**62, 2**62, 0], "pieces": []}, "more elements than torch can index"),
    "bytes-mismatch": ({"shape": [9]}, "need 36"),
    "torch-save-not-a-name": ({"dtype": "../x", "serializer": "torch_save"}, "not a torch dtype name"),
}


@pytest.mark.parametrize(("fields", "named"), list(CRAFTED.values()), ids=list(CRAFTED))
def test_crafted_tensor_entries_are_refused_when_the_manifest_is_read(
    tmp_path: Path, fields: dict[str, Any], named: str
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    if fields.get("serializer") == "torch_save":
        document = load_manifest_json(path)
        document["manifest"]["0/extras/w"]["pieces"] = document["manifest"]["0/extras/w"]["pieces"][:1]
        write_manifest_json(path, document)
    _edit_w(path, **fields)
    with pytest.raises(ManifestError, match=named) as info:
        _ = Snapshot(str(path)).metadata
    assert "'extras/w'" in str(info.value)
    for attempt in (
        lambda: Snapshot(str(path)).restore({"extras": StateDict()}),
        lambda: Snapshot(str(path)).read_object("extras/w"),
    ):
        with pytest.raises(ManifestError):
            attempt()


ODD_DTYPES: list[Callable[[], torch.Tensor]] = [
    lambda: torch.arange(6, dtype=torch.uint8).view(torch.bits8),
    lambda: torch.arange(6, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
    lambda: torch.arange(6, dtype=torch.uint8).view(torch.uint3),
]


@pytest.mark.parametrize("make", ODD_DTYPES, ids=["bits8", "float4_e2m1fn_x2", "uint3"])
def test_one_byte_opaque_dtypes_stay_raw_and_round_trip(tmp_path: Path, make: Callable[[], torch.Tensor]) -> None:
    value = make()
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(t=value)})
    entry = Snapshot(str(tmp_path / "s")).get_manifest()["0/sd/t"]
    assert getattr(entry, "serializer", None) == "raw"
    loaded = Snapshot(str(tmp_path / "s")).read_object("sd/t")
    assert loaded.dtype == value.dtype
    assert loaded.view(torch.uint8).tolist() == value.view(torch.uint8).tolist()
