"""The golden snapshot of format version 2 (``tests/golden/v2/sharded``, two ranks) keeps loading.

Built by ``tests/golden/make_golden_v2.py``: a DDP (replicated) model, DTensors sharded by rows,
by columns and replicated, and rank-local state. Read here from a single process, the way a
user inspects a snapshot, and with a reader written from docs/format.md alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit.manifest import ShardedTensorEntry, TensorEntry

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "v2" / "sharded"


def _expected() -> dict[str, Any]:
    return {
        "rows": torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6) / 4,
        "columns": torch.arange(4 * 7, dtype=torch.int64).reshape(4, 7) - 10,
        "everywhere": torch.tensor([1.5, 2.5, 3.5]),
        "weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8,
        "bias": torch.tensor([0.5, -0.25]),
    }


def test_header_and_entry_kinds() -> None:
    metadata = Snapshot(str(GOLDEN)).metadata
    assert metadata.format_version == 2
    assert metadata.world_size == 2
    manifest = metadata.manifest
    assert isinstance(manifest["0/tables/rows"], ShardedTensorEntry)
    assert len(manifest["0/tables/rows"].shards) == 2  # 3 + 2 rows
    assert len(manifest["0/tables/everywhere"].shards) == 1  # replicated shard stored once
    assert isinstance(manifest["0/model/module.weight"], TensorEntry) and manifest["0/model/module.weight"].replicated
    assert "1/model/module.weight" not in manifest and "1/model" in manifest
    assert "1/tables/rows" not in manifest and "1/tables" in manifest


def test_values_read_back() -> None:
    snapshot = Snapshot(str(GOLDEN))
    expected = _expected()
    for name in ("rows", "columns", "everywhere"):
        assert torch.equal(snapshot.read_object(f"tables/{name}"), expected[name]), name
    assert torch.equal(snapshot.read_object("model/module.weight"), expected["weight"])
    assert snapshot.read_object("progress/step") == 100
    assert snapshot.read_object("1/progress/step") == 101
    assert snapshot.read_object("1/progress/tag") == "rank 1"
    # rank 1's view reaches the replicated and sharded entries rank 0 holds
    assert torch.equal(snapshot.read_object("1/tables/columns"), expected["columns"])


def test_restore_as_rank_zero_into_plain_objects() -> None:
    layer = torch.nn.Linear(3, 2)
    tables = StateDict(rows=torch.zeros(5, 6), columns=torch.zeros(4, 7, dtype=torch.int64), everywhere=torch.zeros(3))
    progress = StateDict(step=0, tag="")
    Snapshot(str(GOLDEN)).restore({"tables": tables, "progress": progress})
    expected = _expected()
    for name in ("rows", "columns", "everywhere"):
        assert torch.equal(tables[name], expected[name])
    assert progress == {"step": 100, "tag": "rank 0"}
    state = Snapshot(str(GOLDEN)).read_object("model")
    layer.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    assert torch.equal(layer.weight, expected["weight"]) and torch.equal(layer.bias, expected["bias"])


def test_independent_reader_from_the_spec() -> None:
    """Assemble each sharded_tensor from raw bytes per docs/format.md section 3.7, checking CRCs."""
    document = json.loads((GOLDEN / ".snapshot_metadata").read_text())
    dtypes = {"float32": np.float32, "int64": np.int64}
    expected = _expected()
    for name in ("rows", "columns", "everywhere"):
        entry = document["manifest"][f"0/tables/{name}"]
        assert entry["kind"] == "sharded_tensor"
        dtype = np.dtype(dtypes[entry["dtype"]]).newbyteorder("<")
        out = np.zeros(entry["shape"], dtype=dtype)
        covered = 0
        for shard in entry["shards"]:
            data = b""
            for piece in shard["pieces"]:
                start, end = piece["byte_range"]
                raw = (GOLDEN / piece["location"]).read_bytes()[start:end]
                assert piece["checksum"] == f"crc32c:{crc32c.crc32c(raw):08x}"
                row_bytes = dtype.itemsize * math.prod(shard["sizes"][1:])
                assert len(raw) % row_bytes == 0  # pieces are whole rows
                data += raw
            block = np.frombuffer(data, dtype=dtype).reshape(shard["sizes"])
            index = tuple(slice(o, o + n) for o, n in zip(shard["offsets"], shard["sizes"], strict=True))
            out[index] = block
            covered += block.size
        assert covered == out.size
        assert np.array_equal(out, expected[name].numpy()), name
