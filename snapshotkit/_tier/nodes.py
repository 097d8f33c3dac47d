"""Which node each rank runs on, and which ranks hold the replicas of each rank's local snapshots.

Pure: no process group, no storage, no torch. Every rank computes the same answers from the same
:class:`NodeMap` (the node id of every rank, gathered over the process group by the caller).

A *node* is a failure domain: the ranks on it share its local storage and die with it. Its id is
the host name unless ``SNAPSHOTKIT_NODE_ID`` says otherwise (a scheduler that knows failure domains
better, or a test that plays several nodes on one machine).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import os
import socket
from collections.abc import Mapping

from snapshotkit._text import first_few
from snapshotkit.errors import ConfigError, InvalidArgumentError

__all__ = ["NODE_ID_ENV", "NodeMap", "node_id", "replica_holders"]

#: The environment variable that overrides the host name as this process's node id.
NODE_ID_ENV = "SNAPSHOTKIT_NODE_ID"


def node_id(environ: Mapping[str, str] | None = None) -> str:
    """This process's node id: ``SNAPSHOTKIT_NODE_ID`` if set, else the host name.

    Args:
        environ: the environment to read (``os.environ`` by default).

    Raises:
        ConfigError: ``SNAPSHOTKIT_NODE_ID`` is set but empty or blank.
    """
    env = os.environ if environ is None else environ
    raw = env.get(NODE_ID_ENV)
    if raw is None:
        return socket.gethostname()
    value = raw.strip()
    if not value:
        raise ConfigError(
            f"{NODE_ID_ENV}={raw!r} names no node; set it to a non-empty id of this node's failure domain "
            "(ranks with the same id share local storage), or unset it to use the host name"
        )
    return value


@dataclasses.dataclass(frozen=True)
class NodeMap:
    """The node id of every rank of a process group.

    Attributes:
        nodes: ``nodes[rank]`` is the id of the node rank ``rank`` runs on.
    """

    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not all(isinstance(node, str) for node in self.nodes):
            raise InvalidArgumentError(f"NodeMap.nodes must be a tuple of node ids (str), got {self.nodes!r}")
        if not self.nodes:
            raise ConfigError("a NodeMap needs the node id of at least one rank, got ()")
        if not all(node for node in self.nodes):
            raise ConfigError(f"node ids must not be empty, got {self.nodes!r}; check {NODE_ID_ENV} on every rank")

    @property
    def world_size(self) -> int:
        """How many ranks there are."""
        return len(self.nodes)

    def node_of(self, rank: int) -> str:
        """The id of the node ``rank`` runs on."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise InvalidArgumentError(f"rank must be an int, got {type(rank).__name__} {rank!r}")
        if not 0 <= rank < len(self.nodes):
            raise ConfigError(f"rank {rank} is not in a group of {len(self.nodes)} ranks (0 to {len(self.nodes) - 1})")
        return self.nodes[rank]

    @functools.cached_property
    def node_names(self) -> tuple[str, ...]:
        """The distinct node ids, in the order their first rank appears (the *node order*)."""
        return tuple(dict.fromkeys(self.nodes))

    @functools.cached_property
    def _ranks_by_node(self) -> dict[str, tuple[int, ...]]:
        ranks: dict[str, list[int]] = {node: [] for node in self.node_names}
        for rank, node in enumerate(self.nodes):
            ranks[node].append(rank)
        return {node: tuple(members) for node, members in ranks.items()}

    def ranks_on(self, node: str) -> tuple[int, ...]:
        """The ranks on ``node``, ascending; ``()`` for a node no rank runs on."""
        return self._ranks_by_node.get(node, ())


def replica_holders(nodes: NodeMap, replicas: int) -> tuple[tuple[int, ...], ...]:
    """For each rank (the *owner*), the ranks whose local roots hold copies of its local snapshots.

    Every holder runs on a node other than its owner's, and an owner's holders on distinct nodes,
    so an owner's state survives the loss of any ``replicas`` nodes. The answer depends on
    ``nodes`` alone: every rank computes the same.

    The rule. Lay the ranks out in node order (:attr:`NodeMap.node_names`), each node's ranks
    ascending, at positions ``0 .. W-1``; let ``c`` be the most ranks on one node.

    - If ``(replicas + 1) * c <= W`` (always so when every node runs as many ranks), the k-th
      replica (``k = 1 .. replicas``) of the rank at position ``p`` goes to the rank at position
      ``(p + k*c) mod W``. Two of these positions are at least ``c`` apart both ways round, so
      they never fall in one node's run of at most ``c`` positions; and each ``k`` is a
      permutation, so every rank holds exactly ``replicas`` copies. With ``n`` ranks on every node
      this sends the k-th replica of local rank ``j`` of node ``i`` to local rank ``j`` of node
      ``(i + k) mod N``.
    - Otherwise one node runs too large a share of the ranks for an even spread (its ranks' copies
      must all fit on the other nodes). Owners are then placed greedily, those on larger nodes
      first (they have fewer places to go), then by node order and rank: each replica goes to the
      rank holding the fewest copies so far among the ranks on nodes the owner does not use yet,
      the lower rank on ties. This stays within one copy of the best possible largest load in the
      property tests, which compute that optimum.

    Args:
        nodes: the node of every rank.
        replicas: how many copies of each rank's snapshots other nodes hold (``local_replicas``).

    Returns:
        ``holders[owner]``: the ``replicas`` holder ranks of ``owner`` (the k-th replica's
        holder at index ``k - 1``); all empty when ``replicas`` is 0.

    Raises:
        InvalidArgumentError: ``replicas`` is not an int.
        ConfigError: ``replicas`` is negative, or there are not ``replicas + 1`` nodes.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InvalidArgumentError(
            f"local_replicas must be an int (copies on other nodes), got {type(replicas).__name__} {replicas!r}"
        )
    if replicas < 0:
        raise ConfigError(f"local_replicas must be at least 0, got {replicas}")
    world = nodes.world_size
    if replicas == 0:
        return ((),) * world
    names = nodes.node_names
    if replicas >= len(names):
        raise ConfigError(
            f"local_replicas={replicas} needs {replicas + 1} nodes (each copy on a node of its own, other than its "
            f"owner's), but the ranks run on {len(names)} node(s): {first_few(names)}; set local_replicas to at "
            f"most {len(names) - 1}, or give the ranks of each failure domain their own {NODE_ID_ENV}"
        )
    order = [rank for name in names for rank in nodes.ranks_on(name)]
    largest = max(len(nodes.ranks_on(name)) for name in names)
    if (replicas + 1) * largest <= world:
        holders: list[tuple[int, ...]] = [()] * world
        for position, owner in enumerate(order):
            holders[owner] = tuple(order[(position + k * largest) % world] for k in range(1, replicas + 1))
        return tuple(holders)
    return _greedy_holders(nodes, replicas)


def _greedy_holders(nodes: NodeMap, replicas: int) -> tuple[tuple[int, ...], ...]:
    """The greedy placement of :func:`replica_holders` (for nodes of very different sizes)."""
    names = nodes.node_names
    index = {name: i for i, name in enumerate(names)}
    # One heap of (copies held, rank) per node, and one heap of each node's least loaded rank.
    # IMPORTANT: ``tops`` holds exactly one entry per node, always its node heap's top: a node's
    # heap changes only right after its entry was popped from ``tops``, and the new top is pushed.
    per_node = [[(0, rank) for rank in nodes.ranks_on(name)] for name in names]
    tops = [(0, members[0][1], i) for i, members in enumerate(per_node)]
    heapq.heapify(tops)
    owners = sorted(
        range(nodes.world_size),
        key=lambda rank: (-len(nodes.ranks_on(nodes.nodes[rank])), index[nodes.nodes[rank]], rank),
    )
    holders: list[tuple[int, ...]] = [()] * nodes.world_size
    for owner in owners:
        used = {index[nodes.nodes[owner]]}
        skipped: list[tuple[int, int, int]] = []
        chosen: list[int] = []
        for _ in range(replicas):
            load, rank, node = heapq.heappop(tops)
            while node in used:  # at most ``replicas + 1`` nodes are used, and there are more
                skipped.append((load, rank, node))
                load, rank, node = heapq.heappop(tops)
            heapq.heapreplace(per_node[node], (load + 1, rank))
            new_load, new_rank = per_node[node][0]
            heapq.heappush(tops, (new_load, new_rank, node))
            used.add(node)
            chosen.append(rank)
        for entry in skipped:
            heapq.heappush(tops, entry)
        holders[owner] = tuple(chosen)
    return tuple(holders)
