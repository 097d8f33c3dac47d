"""Writer assignment and replicated paths (``_plan/partition.py``)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit._plan.partition import (
    ReplicatedPaths,
    WriteItem,
    assign_writers,
    common_patterns,
    matches_any,
    replicated_paths,
)

FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def loads_after(owner: dict[str, int], items: list[WriteItem[str]], base_loads: list[int]) -> list[int]:
    loads = list(base_loads)
    for item in items:
        loads[owner[item.key]] += item.nbytes
    return loads


# --------------------------------------------------------------------------- assign_writers: examples


def test_nothing_to_assign() -> None:
    assert assign_writers([], [0, 0]) == {}
    assert assign_writers([], []) == {}


def test_world_size_one_writes_everything() -> None:
    items = [WriteItem("a", 10), WriteItem("b", 0), WriteItem("c", 5, holders=(0,))]
    assert assign_writers(items, [123]) == {"a": 0, "b": 0, "c": 0}


def test_largest_first_onto_the_least_loaded_rank() -> None:
    items = [WriteItem(name, size) for name, size in [("a", 5), ("b", 4), ("c", 3), ("d", 3), ("e", 2)]]
    # a -> 0 (5); b -> 1 (4); c -> 1 (7); d -> 0 (8); e -> 1 (9)
    assert assign_writers(items, [0, 0]) == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    # rank-local bytes count: rank 0 already writes 100
    assert set(assign_writers(items, [100, 0]).values()) == {1}


def test_ties_go_to_the_lower_rank_and_equal_sizes_by_key() -> None:
    assert assign_writers([WriteItem("x", 1)], [0, 0, 0]) == {"x": 0}
    assert assign_writers([WriteItem("x", 1)], [5, 3, 3]) == {"x": 1}
    assert assign_writers([WriteItem("b", 1), WriteItem("a", 1)], [0, 0]) == {"a": 0, "b": 1}


def test_restricted_items_go_to_their_least_loaded_holder() -> None:
    items = [WriteItem("big", 100, holders=(1, 2)), WriteItem("small", 1, holders=(2,)), WriteItem("free", 50)]
    owner = assign_writers(items, [0, 10, 20])
    assert owner["big"] == 1  # rank 0 is lighter but does not hold it
    assert owner["free"] == 0
    assert owner["small"] == 2
    # a holder tie goes to the lower rank, whatever the order holders are listed in
    assert assign_writers([WriteItem("k", 1, holders=(3, 1))], [0, 0, 0, 0]) == {"k": 1}


def test_restricted_assignments_leave_no_stale_choice() -> None:
    """A restricted item raises its writer's load; the next free item must see the new load."""
    items = [WriteItem("r", 10, holders=(0,)), WriteItem("f", 5)]
    assert assign_writers(items, [0, 0]) == {"r": 0, "f": 1}
    # zero-byte items leave the loads as they are and still get a writer
    zeros = [WriteItem(f"z{i}", 0) for i in range(5)] + [WriteItem("r", 0, holders=(1,))]
    assert assign_writers(zeros, [0, 0]) == {"r": 1, "z0": 0, "z1": 0, "z2": 0, "z3": 0, "z4": 0}


def test_free_items_see_every_load_restricted_items_raised() -> None:
    """Restricted items raise ranks 0 and 1 past rank 2 before any free item is placed: the free
    ones go to rank 2 until it passes rank 1, whose load the heap learned only from the load list."""
    items = [WriteItem("r1", 10, holders=(0,)), WriteItem("r2", 5, holders=(1,))]
    items += [WriteItem("f1", 3), WriteItem("f2", 3), WriteItem("f3", 1)]
    assert assign_writers(items, [0, 0, 0]) == {"r1": 0, "r2": 1, "f1": 2, "f2": 2, "f3": 1}


# --------------------------------------------------------------------------- assign_writers: properties

sizes = st.integers(0, 1000)


@st.composite
def writer_problems(draw: st.DrawFn) -> tuple[list[WriteItem[str]], list[int]]:
    """Items (some restricted to holders) and the ranks' base loads."""
    world = draw(st.integers(1, 6))
    base_loads = draw(st.lists(st.integers(0, 3000), min_size=world, max_size=world))
    count = draw(st.integers(0, 30))
    items = []
    for index in range(count):
        holders = draw(
            st.none() | st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True).map(tuple)
        )
        items.append(WriteItem(f"item{index}", draw(sizes), holders))
    return items, base_loads


@FAST
@given(problem=writer_problems(), rng=st.randoms(use_true_random=False))
def test_every_item_gets_exactly_one_allowed_writer(
    problem: tuple[list[WriteItem[str]], list[int]], rng: random.Random
) -> None:
    items, base_loads = problem
    owner = assign_writers(items, base_loads)
    assert set(owner) == {item.key for item in items}
    for item in items:
        assert 0 <= owner[item.key] < len(base_loads)
        if item.holders is not None:
            assert owner[item.key] in item.holders
    # deterministic, and a function of the set of items: any order gives the same answer
    assert assign_writers(items, base_loads) == owner
    shuffled = list(items)
    rng.shuffle(shuffled)
    assert assign_writers(shuffled, base_loads) == owner
    assert assign_writers(iter(shuffled), list(base_loads)) == owner


@FAST
@given(problem=writer_problems())
def test_each_item_goes_to_the_least_loaded_rank_allowed(problem: tuple[list[WriteItem[str]], list[int]]) -> None:
    """The documented rule replayed without a heap: largest first (equal sizes by repr of the key),
    each onto the least loaded rank allowed to write it, the lower rank on ties."""
    items, base_loads = problem
    owner = assign_writers(items, base_loads)
    loads = list(base_loads)
    for item in sorted(items, key=lambda item: (-item.nbytes, repr(item.key))):
        allowed = range(len(loads)) if item.holders is None else item.holders
        assert owner[item.key] == min(allowed, key=lambda rank: (loads[rank], rank))
        loads[owner[item.key]] += item.nbytes


@st.composite
def free_problems(draw: st.DrawFn) -> tuple[list[WriteItem[str]], list[int]]:
    world = draw(st.integers(1, 6))
    base_loads = draw(st.lists(st.integers(0, 3000), min_size=world, max_size=world))
    items = [WriteItem(f"item{i}", size) for i, size in enumerate(draw(st.lists(sizes, max_size=40)))]
    return items, base_loads


@FAST
@given(problem=free_problems())
def test_free_items_keep_the_spread_within_the_largest_item(problem: tuple[list[WriteItem[str]], list[int]]) -> None:
    """The bound the module promises: max - min <= max(spread of the base loads, largest item)."""
    items, base_loads = problem
    loads = loads_after(assign_writers(items, base_loads), items, base_loads)
    largest = max((item.nbytes for item in items), default=0)
    assert max(loads) - min(loads) <= max(max(base_loads) - min(base_loads), largest)


@FAST
@given(world=st.integers(1, 6), base=st.integers(0, 1000), item_sizes=st.lists(sizes, max_size=40))
def test_equal_base_loads_end_within_the_largest_item(world: int, base: int, item_sizes: list[int]) -> None:
    items = [WriteItem(f"item{i}", size) for i, size in enumerate(item_sizes)]
    loads = loads_after(assign_writers(items, [base] * world), items, [base] * world)
    assert max(loads) - min(loads) <= max(item_sizes, default=0)


@settings(max_examples=100, deadline=None, database=None)
@given(world=st.integers(1, 3), item_sizes=st.lists(st.integers(1, 100), max_size=7))
def test_makespan_is_within_grahams_lpt_bound(world: int, item_sizes: list[int]) -> None:
    """max load <= (4/3 - 1/(3R)) * the best possible max load, found here by trying every assignment."""
    items = [WriteItem(f"item{i}", size) for i, size in enumerate(item_sizes)]
    makespan = max(loads_after(assign_writers(items, [0] * world), items, [0] * world))
    best = min(
        (max(sum(size for size, r in zip(item_sizes, choice) if r == rank) for rank in range(world)))
        for choice in itertools.product(range(world), repeat=len(item_sizes))
    )
    assert 3 * world * makespan <= (4 * world - 1) * best


# --------------------------------------------------------------------------- patterns and replicated paths


def test_common_patterns() -> None:
    assert common_patterns([]) == []
    assert common_patterns([["b", "a"]]) == ["a", "b"]
    assert common_patterns([["a", "b", "c"], ("c", "a"), {"a", "c", "d"}]) == ["a", "c"]
    assert common_patterns([["a"], []]) == []


def test_matches_any() -> None:
    assert matches_any("model/w", ["opt/*", "model/*"])
    assert not matches_any("model/w", [])
    assert not matches_any("Model/w", ["model/*"])  # case-sensitive on every platform
    assert matches_any("model/a/b", ["model/*"])  # fnmatch: * crosses /


def test_replicated_paths() -> None:
    assert replicated_paths([], ["*"]) == ReplicatedPaths(frozenset(), {})
    ranks = [
        {"m/same": 1, "m/differs": 1, "m/only0": 1, "other": 1},
        {"m/same": 1, "m/differs": 2, "other": 1},
        {"m/same": 1, "m/differs": 3, "other": 1, "m/only2": 1},
    ]
    assert replicated_paths(ranks, ["m/*"]) == ReplicatedPaths(frozenset({"m/same"}), {"m/differs": (1, 2)})
    assert replicated_paths(ranks, []) == ReplicatedPaths(frozenset(), {})
    # world size 1: everything offered and matched is replicated
    assert replicated_paths(ranks[:1], ["*"]) == ReplicatedPaths(
        frozenset({"m/same", "m/differs", "m/only0", "other"}), {}
    )


@pytest.mark.parametrize("world", [1, 2, 5])
def test_replicated_paths_of_identical_ranks(world: int) -> None:
    offered = {f"p{i}": (i, "sig") for i in range(10)}
    result = replicated_paths([dict(offered) for _ in range(world)], ["p*"])
    assert result == ReplicatedPaths(frozenset(offered), {})
