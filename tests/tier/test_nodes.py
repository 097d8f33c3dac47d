"""Node ids and replica placement (``_tier/nodes.py``)."""

from __future__ import annotations

import itertools
import math
import random
import socket
from collections import Counter, deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit._tier.nodes import NODE_ID_ENV, NodeMap, node_id, replica_holders
from snapshotkit.errors import ConfigError, InvalidArgumentError

FAST = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- node_id


def test_node_id_is_the_host_name_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_ID_ENV, raising=False)
    assert node_id() == socket.gethostname()
    assert node_id({}) == socket.gethostname()


def test_the_variable_overrides_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_ID_ENV, "  rack3-node7 ")
    assert node_id() == "rack3-node7"
    assert node_id({NODE_ID_ENV: "n1"}) == "n1"  # an explicit environment wins over os.environ


@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_a_blank_variable_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=NODE_ID_ENV):
        node_id({NODE_ID_ENV: value})


# --------------------------------------------------------------------------- NodeMap


def test_node_map_helpers() -> None:
    nodes = NodeMap(("b", "a", "b", "c", "a"))
    assert nodes.world_size == 5
    assert nodes.node_of(3) == "c"
    assert nodes.node_names == ("b", "a", "c")
    assert nodes.ranks_on("a") == (1, 4)
    assert nodes.ranks_on("b") == (0, 2)
    assert nodes.ranks_on("nowhere") == ()
    assert nodes == NodeMap(("b", "a", "b", "c", "a"))
    assert hash(nodes) == hash(NodeMap(("b", "a", "b", "c", "a")))


def test_node_map_is_checked() -> None:
    with pytest.raises(InvalidArgumentError):
        NodeMap(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        NodeMap(("a", 1))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        NodeMap(())
    with pytest.raises(ConfigError):
        NodeMap(("a", ""))
    nodes = NodeMap(("a", "b"))
    with pytest.raises(ConfigError, match="rank 2"):
        nodes.node_of(2)
    with pytest.raises(InvalidArgumentError):
        nodes.node_of(True)


# --------------------------------------------------------------------------- replica_holders: examples


def test_no_replicas() -> None:
    assert replica_holders(NodeMap(("a", "a", "b")), 0) == ((), (), ())
    assert replica_holders(NodeMap(("a",)), 0) == ((),)


def test_equal_nodes_shift_by_one_node_per_replica() -> None:
    """Local rank j of node i: its k-th replica on local rank j of node i+k."""
    nodes = NodeMap(("a", "a", "b", "b", "c", "c"))
    assert replica_holders(nodes, 1) == ((2,), (3,), (4,), (5,), (0,), (1,))
    assert replica_holders(nodes, 2) == ((2, 4), (3, 5), (4, 0), (5, 1), (0, 2), (1, 3))


def test_interleaved_ranks_are_laid_out_by_node() -> None:
    # ranks 0,2 on a; 1,3 on b
    assert replica_holders(NodeMap(("a", "b", "a", "b")), 1) == ((1,), (0,), (3,), (2,))


def test_one_large_node_falls_back_to_the_greedy_placement() -> None:
    # 4 ranks on a, 1 on b: every copy of a's ranks must be on b's one rank
    assert replica_holders(NodeMap(("a", "a", "a", "a", "b")), 1) == ((4,), (4,), (4,), (4,), (0,))


def test_too_many_replicas_for_the_nodes() -> None:
    with pytest.raises(ConfigError, match=r"2 node\(s\).*at most 1") as caught:
        replica_holders(NodeMap(("a", "a", "b", "b")), 2)
    assert NODE_ID_ENV in str(caught.value)
    with pytest.raises(ConfigError, match=r"1 node\(s\).*at most 0"):
        replica_holders(NodeMap(("a", "a")), 1)


@pytest.mark.parametrize("replicas", [1.0, "1", None, True])
def test_replicas_must_be_an_int(replicas: object) -> None:
    with pytest.raises(InvalidArgumentError):
        replica_holders(NodeMap(("a", "b")), replicas)  # type: ignore[arg-type]


def test_replicas_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="at least 0"):
        replica_holders(NodeMap(("a", "b")), -1)


# --------------------------------------------------------------------------- replica_holders: properties


@st.composite
def placements(draw: st.DrawFn) -> tuple[NodeMap, int]:
    """A node map (ranks of a node not necessarily contiguous, nodes of different sizes) and a
    replica count the nodes allow."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=2, max_size=7))
    labels = [f"n{i}" for i, size in enumerate(sizes) for _ in range(size)]
    if draw(st.booleans()):
        draw(st.randoms(use_true_random=False)).shuffle(labels)
    replicas = draw(st.integers(0, len(sizes) - 1))
    return NodeMap(tuple(labels)), replicas


def best_max_load(nodes: NodeMap, replicas: int) -> int:
    """The smallest possible largest number of copies one rank holds, by max flow.

    Per node pair, the owners of node i put ``x[i][m] <= |i|`` copies on node m (each owner at most
    one), ``R * |i|`` in all; a node m holding ``y_m <= L * |m|`` copies spreads them ``<= L`` per
    rank. Any such ``x`` is realisable with distinct nodes per owner, so the optimum is the least
    ``L`` for which the flow source -> i (R|i|) -> m != i (|i|) -> sink (L|m|) is ``R * W``.
    """
    names = nodes.node_names
    size = [len(nodes.ranks_on(name)) for name in names]
    need = replicas * nodes.world_size
    for limit in itertools.count(replicas):
        if _max_flow(size, replicas, limit) == need:
            return limit
    raise AssertionError("unreachable")  # pragma: no cover


def _max_flow(size: list[int], replicas: int, limit: int) -> int:
    count = len(size)
    source, sink = 2 * count, 2 * count + 1
    capacity = [[0] * (2 * count + 2) for _ in range(2 * count + 2)]
    for i in range(count):
        capacity[source][i] = replicas * size[i]
        capacity[count + i][sink] = limit * size[i]
        for m in range(count):
            if m != i:
                capacity[i][count + m] = size[i]
    flow = 0
    while True:  # Edmonds-Karp
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            at = queue.popleft()
            for nxt, left in enumerate(capacity[at]):
                if left > 0 and nxt not in parent:
                    parent[nxt] = at
                    queue.append(nxt)
        if sink not in parent:
            return flow
        push, at = math.inf, sink
        while at != source:
            push, at = min(push, capacity[parent[at]][at]), parent[at]
        at = sink
        while at != source:
            capacity[parent[at]][at] -= int(push)
            capacity[at][parent[at]] += int(push)
            at = parent[at]
        flow += int(push)


@FAST
@given(problem=placements())
def test_holders_are_on_distinct_other_nodes(problem: tuple[NodeMap, int]) -> None:
    nodes, replicas = problem
    holders = replica_holders(nodes, replicas)
    assert len(holders) == nodes.world_size
    for owner, held_by in enumerate(holders):
        assert len(held_by) == replicas
        assert all(0 <= holder < nodes.world_size for holder in held_by)
        places = [nodes.node_of(owner)] + [nodes.node_of(holder) for holder in held_by]
        assert len(set(places)) == replicas + 1


@FAST
@given(problem=placements())
def test_losing_fewer_than_replicas_plus_one_nodes_loses_no_rank(problem: tuple[NodeMap, int]) -> None:
    nodes, replicas = problem
    holders = replica_holders(nodes, replicas)
    # every set of fewer than replicas + 1 nodes lies within one of exactly `replicas` nodes
    for lost in itertools.combinations(nodes.node_names, replicas):
        for owner, held_by in enumerate(holders):
            assert any(nodes.node_of(rank) not in lost for rank in (owner, *held_by)), (lost, owner)


@FAST
@given(problem=placements())
def test_load_is_balanced(problem: tuple[NodeMap, int]) -> None:
    """Every rank holds exactly ``replicas`` copies when no node runs more than W / (R+1) ranks;
    otherwise the largest load is within one copy of the best possible."""
    nodes, replicas = problem
    holders = replica_holders(nodes, replicas)
    load = Counter(holder for held_by in holders for holder in held_by)
    largest = max(len(nodes.ranks_on(name)) for name in nodes.node_names)
    if (replicas + 1) * largest <= nodes.world_size:
        assert all(load[rank] == replicas for rank in range(nodes.world_size))
    elif replicas:
        assert max(load.values()) <= best_max_load(nodes, replicas) + 1


@FAST
@given(problem=placements(), rng=st.randoms(use_true_random=False))
def test_placement_depends_on_the_node_map_alone(problem: tuple[NodeMap, int], rng: random.Random) -> None:
    nodes, replicas = problem
    holders = replica_holders(nodes, replicas)
    assert replica_holders(NodeMap(tuple(nodes.nodes)), replicas) == holders
    # renaming the nodes (same grouping) changes nothing
    renamed = {name: f"host-{i}-{rng.random()}" for i, name in enumerate(nodes.node_names)}
    assert replica_holders(NodeMap(tuple(renamed[n] for n in nodes.nodes)), replicas) == holders
