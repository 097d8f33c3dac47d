"""The safetensors writer's naming and layout, below the end-to-end tests of test_export.py."""

from __future__ import annotations

import json
import struct

from snapshotkit._format.entries import PrimitiveEntry, TensorEntry
from snapshotkit.convert._to_safetensors import key_of, plan, refusal


def test_keys_are_logical_paths_with_dots_and_unescaped_keys() -> None:
    assert key_of("model/layer1.weight", None) == "model.layer1.weight"
    assert key_of("model/layer1.weight", "model/") == "layer1.weight"
    assert key_of("extras/a%2Fb/c%25d", "extras/") == "a/b.c%d"


def test_layout_orders_by_item_size_then_key_and_pads_the_header_to_8() -> None:
    entries = {
        "m/a": TensorEntry("float16", (3,), "raw", ()),
        "m/b": TensorEntry("float64", (2,), "raw", ()),
        "m/c": TensorEntry("uint8", (5,), "raw", ()),
        "m/d": TensorEntry("float32", (1,), "raw", ()),
        "m/n": PrimitiveEntry.of(3),
    }
    laid = plan(entries, "m/", None)
    (file,) = laid.files
    assert [t.key for t in file.tensors] == ["b", "d", "a", "c"]
    assert file.offsets == (0, 16, 20, 26)
    (length,) = struct.unpack("<Q", file.header[:8])
    assert len(file.header) == 8 + length and len(file.header) % 8 == 0
    header = json.loads(file.header[8:])
    assert header["a"] == {"dtype": "F16", "shape": [3], "data_offsets": [20, 26]}
    assert file.size == len(file.header) + 31
    assert dict(laid.skipped) == {"m/n": refusal(entries["m/n"])}
