"""What a snapshot holds, from its manifest (``_inspect/summary.py``): leaves, the tree, dtype totals."""

from __future__ import annotations

from pathlib import Path

import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._inspect.summary import containers, dtype_totals, leaves, tree

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "v2" / "sharded"


def test_leaves_of_many_ranks_are_merged_by_logical_path() -> None:
    metadata = Snapshot(str(GOLDEN_V2)).metadata
    found = {leaf.logical_path: leaf for leaf in leaves(metadata)}
    assert found["tables/rows"].sharding == "sharded" and found["tables/rows"].shards == 2
    assert found["tables/rows"].shape == (5, 6) and found["tables/rows"].nbytes == 5 * 6 * 4
    assert found["model/module.weight"].sharding == "replicated" and found["model/module.weight"].ranks == (0,)
    assert found["progress/tag"].sharding == "per_rank" and found["progress/tag"].ranks == (0, 1)
    assert found["progress/tag"].kind == "primitive" and found["progress/tag"].detail == "str"


def test_tree_to_a_depth_sums_what_is_below(tmp_path: Path) -> None:
    state = {
        "model": torch.nn.Linear(2, 3),
        "extra": StateDict(nested={"a": torch.zeros(4), "b": {"c": torch.zeros(2, dtype=torch.int8)}}, empty={}),
    }
    metadata = Snapshot.take(str(tmp_path / "s"), state).metadata
    found = leaves(metadata)
    known = containers(metadata)
    full = tree(found, known, None)
    assert [n.path for n in full] == [  # app_state keys sorted, then the state's own order
        "extra",
        "extra/nested",
        "extra/nested/a",
        "extra/nested/b",
        "extra/nested/b/c",
        "extra/empty",
        "model",
        "model/weight",
        "model/bias",
    ]
    assert not any(n.truncated for n in full)
    shallow = {n.path: n for n in tree(found, known, 2)}
    assert list(shallow) == ["extra", "extra/nested", "extra/empty", "model", "model/weight", "model/bias"]
    nested = shallow["extra/nested"]
    assert (nested.kind, nested.leaves, nested.nbytes, nested.truncated, nested.leaf) == ("dict", 2, 18, True, None)
    assert shallow["model"].kind == "ordered_dict" and shallow["model"].nbytes == 4 * 9
    assert shallow["extra/empty"].leaf is not None and shallow["extra/empty"].kind == "dict"
    totals = [(t.dtype, t.count, t.nbytes) for t in dtype_totals(metadata)]
    assert totals == [("float32", 3, 4 * 9 + 16), ("int8", 1, 2)]
