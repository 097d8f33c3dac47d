"""From what each rank wrote to the manifest (``_plan/merge.py``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings

from plan._world import PATTERNS, TAKE_ID, StateBuilder, World, worlds
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ObjectEntry,
    Piece,
    PrimitiveEntry,
    Shard,
    ShardedTensorEntry,
    TensorEntry,
)
from snapshotkit._format.serialization import dtype_from_name
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import Decision, PieceKey, decide
from snapshotkit._plan.layout import PieceSlot, data_object_location
from snapshotkit._plan.leaves import LocalState, ObjectLeaf, TensorLeaf, rank_info
from snapshotkit._plan.merge import RankResult, finish_rank, merge_results
from snapshotkit._plan.rank_plan import PendingReplicated, PendingSharded, TakePlan, plan_rank

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
LOCATION = data_object_location(0, 0, TAKE_ID)


def take(
    *states: LocalState, chunk_bytes: int = 1 << 20, data_object_bytes: int = 1 << 20
) -> tuple[Decision, list[TakePlan], list[RankResult]]:
    """Plan every rank and finish it as if it wrote each slot, where it was planned, with checksum = its offset + 1."""
    infos = [rank_info(state, "/ckpt", PATTERNS, f"id{rank}") for rank, state in enumerate(states)]
    decision = decide(infos, chunk_bytes=chunk_bytes)
    plans = [
        plan_rank(
            state, decision, rank=rank, take_id=TAKE_ID, chunk_bytes=chunk_bytes, data_object_bytes=data_object_bytes
        )
        for rank, state in enumerate(states)
    ]
    results = [finish_rank(plan, checksums_of(plan)) for plan in plans]
    return decision, plans, results


def checksums_of(plan: TakePlan) -> dict[PieceSlot, Piece]:
    """The pieces a writer reports when it wrote every slot of ``plan`` where it was planned."""
    return {slot: piece(slot, plan.rank) for data_object in plan.data_objects for slot in data_object.slots}


def piece(slot: PieceSlot, rank: int = 0) -> Piece:
    location = data_object_location(rank, slot.object_index, TAKE_ID)
    return Piece(location, (slot.offset, slot.offset + slot.nbytes), f"crc32c:{slot.offset + 1:08x}")


# --------------------------------------------------------------------------- finish_rank


def test_finishing_a_rank_turns_its_local_leaves_into_entries() -> None:
    state = (
        StateBuilder()
        .tensor("optim/a", (10,))
        .tensor("optim/empty", (0,))
        .primitive("optim/lr", 0.5)
        .obj("optim/meta", 10)
        .build()
    )
    _, (plan,), (result,) = take(state, chunk_bytes=16)
    a0, a1, a2 = plan.slots[0]
    (meta,) = plan.slots[2]
    assert result == RankResult(
        {
            "0/optim": DictEntry(()),
            "0/optim/a": TensorEntry("float32", (10,), "raw", (piece(a0), piece(a1), piece(a2)), False),
            "0/optim/empty": TensorEntry("float32", (0,), "raw", (), False),
            "0/optim/lr": PrimitiveEntry.of(0.5),
            "0/optim/meta": ObjectEntry("builtins.dict", piece(meta), False),
        },
        {},
    )
    assert piece(a1) == Piece(LOCATION, (64, 80), "crc32c:00000041")


def test_finishing_an_empty_plan() -> None:
    assert finish_rank(TakePlan(0, {}, (), {}, {}), {}) == RankResult({}, {})
    assert merge_results([], Decision(frozenset(), {}, {}, {}, {}), {}) == {}


def test_shared_pieces_are_reported_by_the_rank_that_wrote_them() -> None:
    state = StateBuilder().tensor("model/w", (32,)).build()
    _, plans, results = take(state, state, chunk_bytes=64)
    for plan, result in zip(plans, results):
        assert result.shared == {key: piece(slot, plan.rank) for key, slot in plan.shared_slots.items()}
        assert len(result.shared) == 1
    assert isinstance(results[0].entries["0/model/w"], PendingReplicated)
    assert results[1].entries == {"1/model": DictEntry(())}


# --------------------------------------------------------------------------- merge_results


def test_a_replicated_tensor_is_assembled_from_every_rank_in_piece_order() -> None:
    state = StateBuilder().tensor("model/w", (48,)).alias("model/tied", "model/w").primitive("model/step", 1).build()
    decision, plans, results = take(state, state, state, chunk_bytes=64)  # three pieces, one per rank
    manifest = merge_results(results, decision, {})
    slots = [next(iter(plan.shared_slots.values())) for plan in plans]
    expected = (piece(slots[0], 0), piece(slots[1], 1), piece(slots[2], 2))
    assert [decision.owner[key] for key in decision.pieces("model/w")] == [0, 1, 2]
    assert [s.object_index for s in slots] == [0, 0, 0]
    assert manifest == {
        "0/model": DictEntry(()),
        "1/model": DictEntry(()),
        "2/model": DictEntry(()),
        "0/model/w": TensorEntry("float32", (48,), "raw", expected, True),
        "0/model/tied": TensorEntry("float32", (48,), "raw", expected, True),  # the same pieces
        "0/model/step": PrimitiveEntry.of(1, True),
    }


def test_a_replicated_object_and_a_zero_byte_tensor() -> None:
    state = StateBuilder().obj("model/meta", 7).tensor("model/empty", (0,)).build()
    decision, plans, results = take(state, state)
    manifest = merge_results(results, decision, {})
    ((rank, slot),) = [(plan.rank, slot) for plan in plans for slot in plan.shared_slots.values()]
    assert manifest["0/model/meta"] == ObjectEntry("builtins.dict", piece(slot, rank), True)
    assert manifest["0/model/empty"] == TensorEntry("float32", (0,), "raw", (), True)


def test_a_sharded_tensor_is_assembled_from_its_distinct_boxes() -> None:
    top, bottom = Box((0, 0), (1, 2)), Box((1, 0), (3, 2))
    states = [
        StateBuilder().sharded("dt", (4, 2), [top], "int64").tensor("optim/x", (1,)).build(),
        StateBuilder().sharded("dt", (4, 2), [bottom], "int64").build(),
        StateBuilder().sharded("dt", (4, 2), [bottom], "int64").build(),  # a replica of rank 1's box
    ]
    decision, plans, results = take(*states, chunk_bytes=16)  # one 16-byte row a piece
    manifest = merge_results(results, decision, {"dt": "a 2-rank mesh"})
    written = {key: piece(slot, plan.rank) for plan in plans for key, slot in plan.shared_slots.items()}
    assert manifest["0/dt"] == ShardedTensorEntry(
        "int64",
        (4, 2),
        (
            Shard((0, 0), (1, 2), (written[PieceKey("dt", 0, (0, 0))],)),
            Shard((1, 0), (3, 2), tuple(written[PieceKey("dt", i, (1, 0))] for i in range(3))),
        ),
        "a 2-rank mesh",
    )
    assert {decision.owner[PieceKey("dt", i, (1, 0))] for i in range(3)} == {1, 2}
    assert set(manifest) == {"0/dt", "0/optim", "0/optim/x"}
    assert isinstance(results[0].entries["0/dt"], PendingSharded)
    without_layout = merge_results(results, decision, {})["0/dt"]
    assert isinstance(without_layout, ShardedTensorEntry)
    assert without_layout.layout == ""


def test_a_sharded_piece_no_rank_reported_is_named() -> None:
    halves = [Box((0, 0), (2, 2)), Box((2, 0), (2, 2))]
    states = [StateBuilder().sharded("dt", (4, 2), [halves[rank]]).build() for rank in range(2)]
    decision, _, results = take(*states, chunk_bytes=64)
    lost = RankResult(results[1].entries, {}, results[1].pending)  # rank 1's box piece went missing
    with pytest.raises(KeyError, match=r"\(2, 0\) of 'dt'"):
        merge_results([results[0], lost], decision, {})
    # a rank without pending entries is copied as it is; rank 0's pending ones are assembled
    assert not results[1].pending and results[0].pending


# --------------------------------------------------------------------------- properties


def stored_bytes(entry: Entry) -> list[tuple[Piece, ...]]:
    if isinstance(entry, TensorEntry):
        return [entry.pieces]
    if isinstance(entry, ObjectEntry):
        return [(entry.piece,)]
    if isinstance(entry, ShardedTensorEntry):
        return [shard.pieces for shard in entry.shards]
    return []


@FAST
@given(world=worlds())
def test_the_manifest_holds_every_leaf_and_every_written_byte_once(world: World) -> None:
    decision = world.decide()
    plans = world.plans(decision)
    results = [finish_rank(plan, checksums_of(plan)) for plan in plans]
    manifest = merge_results(results, decision, {})
    assert merge_results(results[::-1], decision, {}) == manifest  # what each rank reports, not when
    assert all(result.ordered for result in results)  # placed by position: the same as by key
    by_key = [dataclasses.replace(result, ordered=False) for result in results]
    assert merge_results(by_key, decision, {}) == manifest
    assert set(manifest) == {key for plan in plans for key in plan.entries}
    assert not any(isinstance(entry, (PendingReplicated, PendingSharded)) for entry in manifest.values())

    # every piece is a slot some rank wrote, and no slot is shared by two entries (tied tensors aside)
    slots = {
        piece(slot, plan.rank): slot
        for plan in plans
        for data_object in plan.data_objects
        for slot in data_object.slots
    }
    users: dict[Piece, set[str]] = {}
    for key, entry in manifest.items():
        for pieces in stored_bytes(entry):
            for stored in pieces:
                assert stored in slots
                users.setdefault(stored, set()).add(key)
    assert set(users) == set(slots)  # nothing written that no entry reads
    for keys in users.values():
        if len(keys) > 1:
            # tied tensors read the pieces of the tensor they are tied to
            sources = set()
            for key in keys:
                rank, path = key.split("/", 1)
                leaf = world.states[int(rank)].leaves[path]
                assert isinstance(leaf, TensorLeaf)
                sources.add(leaf.alias_of or path)
            assert len(sources) == 1

    # and each entry's pieces hold exactly its bytes, in order
    for key, entry in manifest.items():
        rank, path = int(key.split("/")[0]), key.split("/", 1)[1]
        leaf = world.states[rank].leaves.get(path)
        if isinstance(entry, (TensorEntry, ObjectEntry)):
            assert isinstance(leaf, (TensorLeaf, ObjectLeaf))
            payload = world.states[rank].payloads[leaf.payload]
            nbytes = sum(p.nbytes for pieces in stored_bytes(entry) for p in pieces)
            assert nbytes == payload.nbytes
            assert entry.replicated == (path in decision.replicated)
            spans = [(slots[p].start, slots[p].end) for pieces in stored_bytes(entry) for p in pieces]
            assert [start for start, _ in spans] == [0, *(end for _, end in spans)][: len(spans)]
        elif isinstance(entry, ShardedTensorEntry):
            description = decision.sharded[path]
            itemsize = dtype_from_name(description.dtype).itemsize
            assert [Box(s.offsets, s.sizes) for s in entry.shards] == list(description.boxes)
            for shard in entry.shards:
                assert sum(p.nbytes for p in shard.pieces) == math.prod(shard.sizes) * itemsize
