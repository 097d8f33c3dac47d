"""What one rank holds, described for planning (``_plan/leaves.py``)."""

from __future__ import annotations

import pickle

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plan._world import StateBuilder
from snapshotkit._format.entries import PrimitiveEntry
from snapshotkit._format.serialization import TORCH_SAVE
from snapshotkit._format.sharded import Box
from snapshotkit._plan.leaves import (
    LeafSignature,
    LocalState,
    Payload,
    RankInfo,
    ShardedDescription,
    rank_info,
    signature,
)

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def test_payload_of_a_tensor() -> None:
    payload = Payload.of_tensor(torch.zeros(3, 5, dtype=torch.float16))
    assert (payload.nbytes, payload.itemsize) == (30, 2)
    assert payload.zero_copy
    assert not Payload.of_tensor(torch.zeros(5, 3).t()).zero_copy  # strided: needs a staging copy
    empty = Payload.of_tensor(torch.zeros(0, 4))
    assert (empty.nbytes, empty.itemsize) == (0, 4)


def test_payload_of_bytes_is_one_element() -> None:
    payload = Payload.of_bytes(b"abcdef")
    assert (payload.nbytes, payload.itemsize, payload.data) == (6, 6, b"abcdef")
    assert payload.zero_copy
    assert Payload.of_bytes(b"").itemsize == 1  # never a zero element size
    assert not Payload(8, 4).zero_copy  # neither tensor nor bytes behind it


def test_signatures() -> None:
    state = (
        StateBuilder()
        .tensor("m/w", (2, 3))
        .alias("m/tied", "m/w")
        .tensor("m/q", (4,), serializer=TORCH_SAVE)
        .obj("m/meta", 9)
        .primitive("m/step", 12)
        .primitive("m/none", None)
        .build()
    )
    leaves = state.leaves
    assert signature(state, leaves["m/w"]) == LeafSignature("tensor", "float32", (2, 3), "raw", 24)
    assert signature(state, leaves["m/tied"]) == LeafSignature("alias", "float32", (2, 3), alias_of="m/w")
    assert signature(state, leaves["m/q"]) == LeafSignature("tensor", "float32", (4,), TORCH_SAVE, 64 + 16)
    assert signature(state, leaves["m/meta"]) == LeafSignature("object", nbytes=9, obj_type="builtins.dict")
    assert signature(state, leaves["m/step"]) == LeafSignature("primitive", obj_type="int", value="12")
    assert signature(state, leaves["m/none"]) == LeafSignature("primitive", obj_type="none", value="None")
    # what must match across ranks: equal leaves have equal signatures, different ones do not
    assert signature(state, PrimitiveEntry.of(12)) == signature(state, leaves["m/step"])
    assert signature(state, PrimitiveEntry.of(12.0)) != signature(state, leaves["m/step"])


def test_rank_info_offers_only_matching_non_sharded_leaves() -> None:
    box = Box((0,), (4,))
    state = (
        StateBuilder()
        .tensor("model/w", (4,))
        .tensor("optim/m", (100,))
        .sharded("dt", (4,), [box])
        .primitive("model/step", 1)
        .build()
    )
    info = rank_info(state, "/ckpt", ["model/*", "dt"], "id")
    assert info == RankInfo(
        "/ckpt",
        ("model/*", "dt"),
        {
            "model/w": LeafSignature("tensor", "float32", (4,), "raw", 16),
            "model/step": LeafSignature("primitive", obj_type="int", value="1"),
        },
        {"dt": ShardedDescription("float32", (4,), (box,))},
        16 + 400,  # every payload but the sharded tensor's
        "id",
    )
    assert pickle.loads(pickle.dumps(info)) == info  # it travels to every other rank
    assert rank_info(state, "/ckpt", [], "id").candidates == {}


def test_an_empty_state() -> None:
    state = LocalState({}, {}, [])
    assert rank_info(state, "p", ["*"], "id") == RankInfo("p", ("*",), {}, {}, 0, "id")
    assert state.sharded_layouts() == {}


def test_sharded_layouts() -> None:
    state = StateBuilder().sharded("a/dt", (2,), [Box((0,), (2,))]).tensor("a/t", (1,)).build()
    assert state.sharded_layouts() == {"a/dt": "test layout of a/dt"}


@FAST
@given(
    sizes=st.lists(st.integers(0, 100), max_size=8),
    sharded_rows=st.lists(st.integers(0, 10), max_size=3),
    patterns=st.lists(st.sampled_from(["t/*", "t/1", "s/*", "*"]), max_size=3),
)
def test_total_bytes_counts_every_non_sharded_payload(
    sizes: list[int], sharded_rows: list[int], patterns: list[str]
) -> None:
    builder = StateBuilder()
    for index, size in enumerate(sizes):
        builder.tensor(f"t/{index}", (size,), "int64")
    for index, rows in enumerate(sharded_rows):
        builder.sharded(f"s/{index}", (rows, 2), [Box((0, 0), (rows, 2))])
    info = rank_info(builder.build(), "/ckpt", patterns, "id")
    assert info.total_bytes == 8 * sum(sizes)
    assert set(info.shards) == {f"s/{index}" for index in range(len(sharded_rows))}
    assert set(info.candidates) == {
        f"t/{index}" for index in range(len(sizes)) if any(p in ("t/*", "*") or p == f"t/{index}" for p in patterns)
    }
