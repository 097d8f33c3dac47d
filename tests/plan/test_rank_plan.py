"""One rank's take plan (``_plan/rank_plan.py``): its pending entries and the data objects it writes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from plan._world import PATTERNS, TAKE_ID, StateBuilder, World, worlds
from snapshotkit._format.entries import DictEntry, PrimitiveEntry
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import PieceKey, decide
from snapshotkit._plan.layout import PieceSlot, Span, data_object_location
from snapshotkit._plan.leaves import LocalState, ObjectLeaf, ShardedLeaf, TensorLeaf, rank_info
from snapshotkit._plan.rank_plan import (
    PendingObject,
    PendingReplicated,
    PendingSharded,
    PendingTensor,
    TakePlan,
    plan_rank,
)

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def plans_for(*states: LocalState, chunk_bytes: int = 1 << 20, data_object_bytes: int = 1 << 20) -> list[TakePlan]:
    infos = [rank_info(state, "/ckpt", PATTERNS, f"id{rank}") for rank, state in enumerate(states)]
    decision = decide(infos, chunk_bytes=chunk_bytes)
    return [
        plan_rank(
            state, decision, rank=rank, take_id=TAKE_ID, chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes
        )
        for rank, state in enumerate(states)
    ]


def test_a_single_rank_with_only_local_leaves() -> None:
    state = (
        StateBuilder()
        .tensor("optim/a", (10,))
        .tensor("optim/empty", (0,))
        .primitive("optim/lr", 0.5)
        .obj("optim/meta", 10)
        .build()
    )
    (plan,) = plans_for(state, chunk_bytes=16)
    assert plan.entries == {
        "0/optim": DictEntry(()),
        "0/optim/a": PendingTensor(0, "float32", (10,), "raw"),
        "0/optim/empty": PendingTensor(1, "float32", (0,), "raw"),
        "0/optim/lr": PrimitiveEntry.of(0.5),
        "0/optim/meta": PendingObject(2, "builtins.dict"),
    }
    location = data_object_location(0, 0, TAKE_ID)
    assert plan.slots == {
        0: (PieceSlot(0, 0, 16, 0, 0), PieceSlot(0, 16, 32, 0, 64), PieceSlot(0, 32, 40, 0, 128)),
        1: (),  # a zero-byte tensor has no pieces
        # serialized bytes: one piece, whatever the chunk, in a data object after the tensors'
        2: (PieceSlot(2, 0, 10, 1, 0),),
    }
    assert plan.shared_slots == {}
    assert plan.nbytes == 128 + 8 + 10  # padding between slots, none after the last
    assert [p.location for p in plan.data_objects] == [location, data_object_location(0, 1, TAKE_ID)]


def test_an_empty_state_writes_nothing() -> None:
    (plan,) = plans_for(StateBuilder().build())
    assert plan == TakePlan(0, {}, (), {}, {})
    assert plan.nbytes == 0


def test_replicated_leaves_appear_in_rank_0s_entries_only() -> None:
    state = (
        StateBuilder()
        .tensor("model/w", (32,))
        .alias("model/tied", "model/w")
        .primitive("model/step", 3)
        .obj("model/meta", 5)
        .build()
    )
    first, second = plans_for(state, state, chunk_bytes=64)
    w, tied, meta = state.leaves["model/w"], state.leaves["model/tied"], state.leaves["model/meta"]
    assert isinstance(w, TensorLeaf)
    assert isinstance(tied, TensorLeaf)
    assert isinstance(meta, ObjectLeaf)
    assert first.entries == {
        "0/model": DictEntry(()),
        "0/model/w": PendingReplicated("model/w", w),
        "0/model/tied": PendingReplicated("model/w", tied),  # the pieces of the tensor it is tied to
        "0/model/step": PrimitiveEntry.of(3, True),
        "0/model/meta": PendingReplicated("model/meta", meta),
    }
    assert second.entries == {"1/model": DictEntry(())}
    assert first.slots == second.slots == {}
    # the two 64-byte pieces of model/w and the object are spread over both ranks
    written = {**first.shared_slots, **second.shared_slots}
    assert set(written) == {PieceKey("model/w", 0), PieceKey("model/w", 1), PieceKey("model/meta", 0)}
    assert first.shared_slots.keys().isdisjoint(second.shared_slots.keys())
    assert first.shared_slots and second.shared_slots
    assert written[PieceKey("model/w", 1)].start == 64


def test_sharded_leaves_pending_on_rank_0_and_each_box_written_by_one_holder() -> None:
    top, bottom = Box((0,), (3,)), Box((3,), (5,))
    first = StateBuilder().sharded("dt", (8,), [top]).build()
    second = StateBuilder().sharded("dt", (8,), [bottom]).tensor("optim/x", (1,)).build()
    plans = plans_for(first, second, chunk_bytes=8)
    assert plans[0].entries == {"0/dt": PendingSharded("dt")}
    assert plans[1].entries == {"1/optim": DictEntry(()), "1/optim/x": PendingTensor(1, "float32", (1,), "raw")}
    # 4-byte rows, 8-byte chunks: two rows a piece
    assert {key: (slot.start, slot.end) for key, slot in plans[0].shared_slots.items()} == {
        PieceKey("dt", 0, (0,)): (0, 8),
        PieceKey("dt", 1, (0,)): (8, 12),
    }
    assert sorted((key.index, slot.end) for key, slot in plans[1].shared_slots.items()) == [(0, 8), (1, 16), (2, 20)]
    # rank-local pieces come first in the data objects, then the shared ones
    assert [slot.payload for plan in plans[1].data_objects for slot in plan.slots] == [1, 0, 0, 0]


# --------------------------------------------------------------------------- properties


def payload_of(state: LocalState, key: PieceKey) -> int:
    """The index of the payload holding ``key``'s bytes on a rank that has them."""
    leaf = state.leaves[key.path]
    if isinstance(leaf, ShardedLeaf):
        (payload,) = {box.payload for box in leaf.boxes if box.box.offsets == key.shard_offsets}
        return payload
    assert isinstance(leaf, (TensorLeaf, ObjectLeaf))
    return leaf.payload


@FAST
@given(world=worlds())
def test_each_rank_writes_exactly_the_pieces_it_owns(world: World) -> None:
    decision = world.decide()
    plans = world.plans(decision)
    assert world.plans(decision) == plans  # deterministic
    written: dict[PieceKey, int] = {}
    for rank, (plan, state) in enumerate(zip(plans, world.states)):
        assert plan.rank == rank
        for key, slot in plan.shared_slots.items():
            assert key not in written
            written[key] = rank
            assert Span(slot.start, slot.end) == decision.spans[key]
            assert slot.payload == payload_of(state, key)
    assert written == decision.owner


@FAST
@given(world=worlds())
def test_each_rank_lays_out_its_bytes_once(world: World) -> None:
    decision = world.decide()
    locations: set[str] = set()
    for rank, (plan, state) in enumerate(zip(world.plans(decision), world.states)):
        # the rank-local payloads: leaves stored per rank, each covered by its slots in order
        local = {
            leaf.payload
            for path, leaf in state.leaves.items()
            if isinstance(leaf, (TensorLeaf, ObjectLeaf)) and path not in decision.replicated
        }
        assert plan.slots.keys() == local
        for index, slots in plan.slots.items():
            assert [s.start for s in slots] == [0, *(s.end for s in slots)][: len(slots)]
            assert (slots[-1].end if slots else 0) == state.payloads[index].nbytes
        # the data objects hold every local slot of a raw tensor (by payload), then every shared
        # one, then the local serialized bytes (in data objects of their own), each once
        in_objects = [slot for data_object in plan.data_objects for slot in data_object.slots]
        serialized = {index for index in plan.slots if state.payloads[index].data is not None}
        raw_slots = [slot for index in sorted(plan.slots.keys() - serialized) for slot in plan.slots[index]]
        serialized_slots = [slot for index in sorted(serialized) for slot in plan.slots[index]]
        assert in_objects == raw_slots + list(plan.shared_slots.values()) + serialized_slots
        if serialized_slots and len(in_objects) > len(serialized_slots):
            assert in_objects[-len(serialized_slots) - 1].object_index < serialized_slots[0].object_index
        for index, data_object in enumerate(plan.data_objects):
            assert data_object.location == data_object_location(rank, index, TAKE_ID)
            assert all(slot.object_index == index for slot in data_object.slots)
            assert data_object.nbytes <= world.data_object_bytes or len(data_object.slots) == 1
        assert plan.nbytes == sum(data_object.nbytes for data_object in plan.data_objects)
        names = {data_object.location for data_object in plan.data_objects}
        assert locations.isdisjoint(names)  # no two ranks write the same data object
        locations |= names


@FAST
@given(world=worlds())
def test_every_leaf_has_one_entry_on_one_rank(world: World) -> None:
    decision = world.decide()
    for rank, (plan, state) in enumerate(zip(world.plans(decision), world.states)):
        expected = {f"{rank}/{path}" for path in state.containers}
        for path, leaf in state.leaves.items():
            shared = isinstance(leaf, ShardedLeaf) or path in decision.replicated
            if rank == 0 or not shared:
                expected.add(f"{rank}/{path}")
        assert set(plan.entries) == expected
        for key, entry in plan.entries.items():
            if isinstance(entry, (PendingReplicated, PendingSharded)):
                assert rank == 0
                assert key.removeprefix("0/") in decision.replicated | set(decision.sharded)
