"""Reusing a plan (``_plan/digest.py``, ``fix_plan`` + ``finish_plan``): the structure digest changes
exactly when the plan could, and a fixed plan finished for a later take equals that take's own plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings

from plan._world import PATTERNS, TAKE_ID, StateBuilder, World, worlds
from snapshotkit._format.entries import DictEntry, PrimitiveEntry
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import decide
from snapshotkit._plan.digest import DIGEST_LIMIT, shared_values_digest, structure_digest
from snapshotkit._plan.leaves import Leaf, LocalState, ObjectLeaf, Payload, TensorLeaf, rank_info
from snapshotkit._plan.rank_plan import finish_plan, fix_plan, plan_rank

FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def base() -> StateBuilder:
    return (
        StateBuilder()
        .tensor("model/w", (4, 8))
        .alias("model/tied", "model/w")
        .primitive("model/step", 1)
        .obj("optim/meta", 10)
        .sharded("dt", (8,), [Box((0,), (4,))])
    )


def digest_of(state: LocalState, patterns: tuple[str, ...] = PATTERNS, rank: int = 0, world: int = 2) -> int:
    return structure_digest(state, patterns, rank=rank, world_size=world)


def test_the_digest_ignores_primitive_values_and_serialized_sizes() -> None:
    first = base().build()
    later = base().build()
    later.leaves["model/step"] = PrimitiveEntry.of(2)
    index = later.leaves["optim/meta"].payload  # type: ignore[union-attr]
    later.payloads[index] = Payload.of_bytes(b"y" * 99)  # type: ignore[index]
    assert digest_of(first) == digest_of(later)


def renamed(leaves: dict[str, Leaf], old: str, new: str) -> dict[str, Leaf]:
    return {new if path == old else path: leaf for path, leaf in leaves.items()}


W = "model/w"
CHANGES: dict[str, Callable[[dict[str, Leaf]], dict[str, Leaf]]] = {
    "shape": lambda leaves: {**leaves, W: dataclasses.replace(leaves[W], shape=(8, 4))},  # type: ignore[type-var]
    "dtype": lambda leaves: {**leaves, W: dataclasses.replace(leaves[W], dtype="bfloat16")},  # type: ignore[type-var]
    "serializer": lambda leaves: {**leaves, W: dataclasses.replace(leaves[W], serializer="torch_save")},  # type: ignore[type-var]
    "path": lambda leaves: renamed(leaves, W, "model/v"),
    "tensor to object": lambda leaves: {**leaves, W: ObjectLeaf(0, "builtins.dict")},
    "tensor to primitive": lambda leaves: {**leaves, W: PrimitiveEntry.of(1)},
    "entry added": lambda leaves: {**leaves, "model/extra": PrimitiveEntry.of(0)},
    "entry removed": lambda leaves: {k: v for k, v in leaves.items() if k != "optim/meta"},
    "order": lambda leaves: dict(reversed(leaves.items())),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_digest_changes_with_any_leaf(change: str) -> None:
    state = base().build()
    changed = LocalState(state.containers, CHANGES[change](dict(state.leaves)), state.payloads)
    assert digest_of(changed) != digest_of(state)


def test_the_digest_changes_with_the_containers() -> None:
    state = base().build()
    changed = LocalState({"model": DictEntry(("w",))}, state.leaves, state.payloads)
    assert digest_of(changed) != digest_of(state)


def test_the_digest_changes_with_ties_boxes_patterns_and_place_in_the_group() -> None:
    state = base().build()
    untied = base().build()
    untied.leaves["model/tied"] = dataclasses.replace(untied.leaves["model/tied"], alias_of=None)  # type: ignore[type-var]
    moved = base().build()
    moved.leaves["dt"] = StateBuilder().sharded("dt", (8,), [Box((4,), (4,))]).build().leaves["dt"]
    swapped = base().build()  # the primitive and the object trade places: same values, other kinds
    swapped.leaves["model/step"], swapped.leaves["optim/meta"] = (
        ObjectLeaf(swapped.leaves["optim/meta"].payload, "builtins.dict"),  # type: ignore[union-attr]
        PrimitiveEntry.of(1),
    )
    reference = digest_of(state)
    assert digest_of(untied) != reference
    assert digest_of(moved) != reference
    assert digest_of(swapped) != reference
    assert digest_of(state, ("model/**",)) != reference
    assert digest_of(state, rank=1) != reference
    assert digest_of(state, world=3) != reference
    assert digest_of(base().build()) == reference


def test_the_shared_digest_covers_the_path_and_the_replicated_primitives() -> None:
    state = base().build()
    other = base().build()
    other.leaves["model/step"] = PrimitiveEntry.of(2)
    as_float = base().build()
    as_float.leaves["model/step"] = PrimitiveEntry.of(1.0)
    paths = ["model/step"]
    digest = shared_values_digest("/ckpt", state, paths)
    assert 0 <= digest < DIGEST_LIMIT
    assert shared_values_digest("/ckpt", base().build(), paths) == digest
    assert shared_values_digest("/other", state, paths) != digest
    assert shared_values_digest("/ckpt", other, paths) != digest
    assert shared_values_digest("/ckpt", as_float, paths) != digest
    assert shared_values_digest("/ckpt", other, []) == shared_values_digest("/ckpt", state, [])


def relabelled(state: LocalState, step: int, object_bytes: int) -> LocalState:
    """``state`` at a later step: other primitive values, other sizes of serialized bytes."""
    leaves = dict(state.leaves)
    payloads = list(state.payloads)
    for path, leaf in state.leaves.items():
        if isinstance(leaf, PrimitiveEntry):
            leaves[path] = PrimitiveEntry.of(f"{leaf.value!r} at {step}")
        # serialized bytes change size, except replicated candidates' (see plan_cache)
        elif not path.startswith("model/") and (
            isinstance(leaf, ObjectLeaf) or (isinstance(leaf, TensorLeaf) and leaf.serializer != "raw")
        ):
            payloads[leaf.payload] = Payload.of_bytes(b"z" * (object_bytes + leaf.payload))
    return LocalState(state.containers, leaves, payloads)


@FAST
@given(world=worlds())
def test_a_fixed_plan_finished_for_a_later_take_is_that_takes_plan(world: World) -> None:
    decision = world.decide()
    later = [relabelled(state, 7, 3) for state in world.states]
    infos = [rank_info(state, "/ckpt", PATTERNS, TAKE_ID) for state in later]
    same = decide(infos, chunk_bytes=world.chunk_bytes)
    sizes = {"chunk_bytes": world.chunk_bytes, "data_object_bytes": world.data_object_bytes}
    for rank, (state, now) in enumerate(zip(world.states, later, strict=True)):
        fixed = fix_plan(state, decision, rank=rank, **sizes)
        assert digest_of(state, rank=rank) == digest_of(now, rank=rank)
        reused = finish_plan(fixed, now, take_id="later", **sizes)
        if same.replicated == decision.replicated and same.owner == decision.owner:
            assert reused == plan_rank(now, same, rank=rank, take_id="later", **sizes)
        assert reused == plan_rank(now, decision, rank=rank, take_id="later", **sizes)
        assert {d.location for d in reused.data_objects}.isdisjoint(
            d.location for d in finish_plan(fixed, now, take_id="other", **sizes).data_objects
        )
