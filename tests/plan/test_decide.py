"""The shared decision of a take (``_plan/decide.py``): what is replicated, and who writes each piece."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings

from plan._world import PATTERNS, StateBuilder, World, worlds
from snapshotkit._format.entries import PrimitiveEntry
from snapshotkit._format.serialization import TORCH_SAVE, dtype_from_name
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import Decision, PieceKey, decide
from snapshotkit._plan.gathered import Gathered, box_tables
from snapshotkit._plan.layout import Span
from snapshotkit._plan.leaves import (
    LocalState,
    ObjectLeaf,
    RankInfo,
    ShardedDescription,
    ShardedLeaf,
    TensorLeaf,
    rank_info,
)
from snapshotkit.errors import UnsupportedValueError

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def infos_of(*states: LocalState, patterns: tuple[str, ...] = PATTERNS) -> list[RankInfo]:
    return [rank_info(state, "/ckpt", patterns, f"id{rank}") for rank, state in enumerate(states)]


def spans_of(decision: Decision, path: str, shard_offsets: tuple[int, ...] | None = None) -> list[Span]:
    return [decision.spans[key] for key in decision.pieces(path, shard_offsets)]


# --------------------------------------------------------------------------- replicated leaves


def test_world_size_one_writes_every_piece() -> None:
    state = StateBuilder().tensor("model/w", (100,)).tensor("optim/x", (3,)).build()
    decision = decide(infos_of(state), chunk_bytes=64)
    assert decision.replicated == {"model/w"}
    assert spans_of(decision, "model/w") == [Span(i, min(i + 64, 400)) for i in range(0, 400, 64)]
    assert set(decision.owner.values()) == {0}
    assert decision.sharded == {}
    assert decision.differing == {}


def test_without_patterns_nothing_is_replicated() -> None:
    state = StateBuilder().tensor("model/w", (100,)).build()
    decision = decide(infos_of(state, state, patterns=()), chunk_bytes=64)
    assert decision == Decision(frozenset(), {}, {}, {}, {})


def test_pieces_of_a_replicated_tensor_are_spread_over_the_ranks() -> None:
    state = StateBuilder().tensor("model/w", (64,)).build()  # 256 bytes: four 64-byte pieces
    decision = decide(infos_of(state, state), chunk_bytes=64)
    keys = decision.pieces("model/w")
    assert keys == [PieceKey("model/w", i) for i in range(4)]
    assert [decision.owner[key] for key in keys] == [0, 1, 0, 1]


def test_rank_local_bytes_count_towards_the_balance() -> None:
    busy = StateBuilder().tensor("model/w", (64,)).tensor("optim/big", (1000,)).build()
    idle = StateBuilder().tensor("model/w", (64,)).build()
    decision = decide(infos_of(busy, idle), chunk_bytes=64)
    assert {decision.owner[key] for key in decision.pieces("model/w")} == {1}


def test_a_tied_tensor_is_replicated_with_its_target_and_has_no_pieces_of_its_own() -> None:
    state = StateBuilder().tensor("model/w", (8,)).alias("model/tied", "model/w").build()
    decision = decide(infos_of(state, state), chunk_bytes=1 << 20)
    assert decision.replicated == {"model/w", "model/tied"}
    assert decision.pieces("model/tied") == []
    assert spans_of(decision, "model/w") == [Span(0, 32)]


def test_a_tied_tensor_whose_target_differs_is_stored_per_rank() -> None:
    first = StateBuilder().tensor("model/w", (8,)).alias("model/tied", "model/w").build()
    second = StateBuilder().tensor("model/w", (9,)).alias("model/tied", "model/w").build()
    decision = decide(infos_of(first, second), chunk_bytes=1 << 20)
    assert decision.replicated == frozenset()
    assert decision.differing == {"model/w": (1,), "model/tied": (1,)}
    assert decision.owner == {}


def test_primitives_are_replicated_inline() -> None:
    state = StateBuilder().primitive("model/step", 3).build()
    decision = decide(infos_of(state, state, state), chunk_bytes=1)
    assert decision.replicated == {"model/step"}
    assert decision.owner == {}


def test_serialized_bytes_are_one_piece_whatever_the_chunk() -> None:
    state = StateBuilder().obj("model/meta", 500).tensor("model/q", (10,), serializer=TORCH_SAVE).build()
    decision = decide(infos_of(state, state), chunk_bytes=16)
    assert spans_of(decision, "model/meta") == [Span(0, 500)]
    assert spans_of(decision, "model/q") == [Span(0, 64 + 40)]  # the test blob: 64 + 10 float32s


def test_zero_byte_tensors_are_replicated_without_pieces() -> None:
    state = StateBuilder().tensor("model/empty", (0, 4)).tensor("model/scalar", ()).build()
    decision = decide(infos_of(state, state), chunk_bytes=2)
    assert decision.replicated == {"model/empty", "model/scalar"}
    assert decision.pieces("model/empty") == []
    assert spans_of(decision, "model/scalar") == [Span(0, 4)]  # one element, larger than the chunk


def test_paths_that_differ_or_are_missing_are_stored_per_rank() -> None:
    a = StateBuilder().tensor("model/same", (2,)).tensor("model/d", (2,)).tensor("model/only0", (2,)).build()
    b = StateBuilder().tensor("model/same", (2,)).tensor("model/d", (2,), "float16").build()
    c = StateBuilder().tensor("model/same", (2,)).tensor("model/d", (3,)).build()
    decision = decide(infos_of(a, b, c), chunk_bytes=1 << 20)
    assert decision.replicated == {"model/same"}
    assert decision.differing == {"model/d": (1, 2)}
    assert decision.pieces("model/only0") == []
    assert decision.pieces("no/such/path") == []


# --------------------------------------------------------------------------- sharded tensors

HALVES = [Box((0, 0), (2, 3)), Box((2, 0), (2, 3))]


def test_each_distinct_box_is_written_once_by_a_rank_holding_it() -> None:
    # ranks 0 and 2 hold the top half, ranks 1 and 3 the bottom half (a 2x2 mesh, replicated on one dim)
    states = [StateBuilder().sharded("dt", (4, 3), [HALVES[rank % 2]]).build() for rank in range(4)]
    decision = decide(infos_of(*states), chunk_bytes=12)  # one 12-byte row a piece
    assert decision.sharded == {"dt": ShardedDescription("float32", (4, 3), tuple(HALVES))}
    for half, holders in zip(HALVES, [{0, 2}, {1, 3}]):
        keys = decision.pieces("dt", half.offsets)
        assert keys == [PieceKey("dt", 0, half.offsets), PieceKey("dt", 1, half.offsets)]
        assert [decision.spans[key] for key in keys] == [Span(0, 12), Span(12, 24)]
        assert {decision.owner[key] for key in keys} == holders  # both holders write one row each
    assert decision.replicated == frozenset()


def test_sharded_boxes_on_world_size_one() -> None:
    state = StateBuilder().sharded("dt", (4, 3), HALVES, "float16").build()
    decision = decide(infos_of(state), chunk_bytes=1 << 20)
    assert [decision.spans[k] for half in HALVES for k in decision.pieces("dt", half.offsets)] == [Span(0, 12)] * 2
    assert set(decision.owner.values()) == {0}


def test_distinct_boxes_in_first_seen_order_with_their_holders() -> None:
    top, bottom = HALVES
    states = [
        StateBuilder().sharded("dt", (4, 3), [bottom]).build(),
        StateBuilder().sharded("dt", (4, 3), [top, bottom]).build(),
        StateBuilder().sharded("dt", (4, 3), [top]).build(),
    ]
    tables = box_tables(Gathered.of_infos(infos_of(*states)))
    assert list(tables) == ["dt"]
    assert (tables["dt"].dtype, tables["dt"].shape, tables["dt"].boxes) == ("float32", (4, 3), (bottom, top))
    assert [tables["dt"].holders(i) for i in range(2)] == [(0, 1), (1, 2)]
    assert box_tables(Gathered.of_infos([])) == {}


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (StateBuilder().sharded("dt", (4, 3), [HALVES[1]], "float16"), "float16"),
        (StateBuilder().sharded("dt", (4, 4), [Box((2, 0), (2, 4))]), r"\[4, 4\]"),
        (StateBuilder().sharded("dt", (4, 3), []), "cover 6 of its 12 elements"),  # bottom half held by nobody
        (StateBuilder().sharded("dt", (4, 3), [Box((1, 0), (3, 3))]), "cover 15 of its 12"),  # overlapping
    ],
)
def test_shards_must_describe_one_tensor_covered_once(second: StateBuilder, message: str) -> None:
    first = StateBuilder().sharded("dt", (4, 3), [HALVES[0]]).build()
    with pytest.raises(UnsupportedValueError, match=message):
        decide(infos_of(first, second.build()), chunk_bytes=1 << 20)


# --------------------------------------------------------------------------- properties


@FAST
@given(world=worlds())
def test_every_rank_reaches_the_same_decision(world: World) -> None:
    """decide is a pure function of all ranks' infos: each rank gets its own (unpickled) copy of
    them from the exchange, and the order of a rank's leaves does not matter."""
    infos = world.infos()
    decision = decide(infos, chunk_bytes=world.chunk_bytes)
    assert decide(infos, chunk_bytes=world.chunk_bytes) == decision
    for _ in range(world.size):
        received = pickle.loads(pickle.dumps(infos))
        assert decide(received, chunk_bytes=world.chunk_bytes) == decision
    reordered = [
        RankInfo(
            info.path,
            info.patterns[::-1],
            dict(reversed(info.candidates.items())),
            dict(reversed(info.shards.items())),
            info.total_bytes,
            info.take_id,
        )
        for info in infos
    ]
    assert decide(reordered, chunk_bytes=world.chunk_bytes) == decision


@FAST
@given(world=worlds())
def test_every_piece_has_one_owner_and_the_pieces_cover_each_payload(world: World) -> None:
    decision = world.decide()
    assert decision.owner.keys() == decision.spans.keys()
    assert all(0 <= rank < world.size for rank in decision.owner.values())
    first = world.states[0]
    for path in decision.replicated:
        spans = spans_of(decision, path)
        assert len(spans) == sum(key.path == path and key.shard_offsets is None for key in decision.spans)
        leaf = first.leaves[path]
        if isinstance(leaf, PrimitiveEntry) or (isinstance(leaf, TensorLeaf) and leaf.alias_of is not None):
            assert spans == []  # primitives are inline; a tied tensor uses its target's pieces
            continue
        assert isinstance(leaf, (TensorLeaf, ObjectLeaf))
        payload = first.payloads[leaf.payload]
        assert [s.start for s in spans] == [0, *(s.end for s in spans)][: len(spans)]
        assert (spans[-1].end if spans else 0) == payload.nbytes
        assert all(0 < s.nbytes <= max(world.chunk_bytes, payload.itemsize) for s in spans)
    for path, description in decision.sharded.items():
        itemsize = dtype_from_name(description.dtype).itemsize
        for box in description.boxes:
            holders = {
                rank
                for rank, state in enumerate(world.states)
                if isinstance(leaf := state.leaves.get(path), ShardedLeaf) and box in {b.box for b in leaf.boxes}
            }
            row_bytes = itemsize * math.prod(box.sizes[1:])
            spans = spans_of(decision, path, box.offsets)
            assert (spans[-1].end if spans else 0) == math.prod(box.sizes) * itemsize
            for span in spans:
                assert span.start % row_bytes == 0 and span.nbytes % row_bytes == 0  # whole rows
                assert span.nbytes <= max(world.chunk_bytes, row_bytes)
            for key in decision.pieces(path, box.offsets):
                assert decision.owner[key] in holders


@FAST
@given(world=worlds())
def test_replicated_paths_are_those_alike_on_every_rank(world: World) -> None:
    decision = world.decide()
    offered = {path for path in world.states[0].leaves if path.startswith("model/")}
    if world.size > 1 and "model/diff" in offered:
        assert decision.differing == {"model/diff": tuple(range(1, world.size))}
        assert decision.replicated == offered - {"model/diff"}
    else:
        assert decision.differing == {}
        assert decision.replicated == offered
    assert {key.path for key in decision.owner} <= decision.replicated | set(decision.sharded)


# --------------------------------------------------------------------------- what the fast paths must not change


def test_piece_key_repr_is_the_dataclass_text() -> None:
    """assign_writers orders equal-sized pieces by repr: the hand-written one must be the dataclass's."""
    for key in (PieceKey("a/b", 0), PieceKey("x'y", 3, (4, 0)), PieceKey("t", 1, ())):
        fields = ", ".join(f"{name}={getattr(key, name)!r}" for name in ("path", "index", "shard_offsets"))
        assert repr(key) == f"PieceKey({fields})"


def test_box_pieces_follow_each_box_and_dtype() -> None:
    """Row spans are shared between boxes of equal sizes and itemsize, never across either."""
    uneven = [Box((0, 0), (3, 4)), Box((3, 0), (1, 4))]  # 3 rows and 1 row
    states = [
        StateBuilder().sharded("a", (4, 4), uneven[:1]).sharded("b", (4, 4), uneven[:1], "float16").build(),
        StateBuilder().sharded("a", (4, 4), uneven[1:]).sharded("b", (4, 4), uneven[1:], "float16").build(),
    ]
    decision = decide(infos_of(*states), chunk_bytes=32)  # two float32 rows, four float16 rows per piece
    assert spans_of(decision, "a", (0, 0)) == [Span(0, 32), Span(32, 48)]
    assert spans_of(decision, "a", (3, 0)) == [Span(0, 16)]
    assert spans_of(decision, "b", (0, 0)) == [Span(0, 24)]
    assert spans_of(decision, "b", (3, 0)) == [Span(0, 8)]
    assert {decision.owner[k] for k in decision.pieces("a", (3, 0)) + decision.pieces("b", (3, 0))} == {1}
