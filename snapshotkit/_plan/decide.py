"""The shared decision of a multi-rank take: what is replicated, and who writes which piece.

Every rank computes :func:`decide` from every rank's :class:`~snapshotkit._plan.leaves.RankInfo`
and gets the same :class:`Decision`, so no rank decides for the others and nothing more is sent.
Replicated leaves and the distinct boxes of sharded tensors are cut into pieces (see
:mod:`snapshotkit._plan.layout`) that :func:`~snapshotkit._plan.partition.assign_writers`
spreads over the ranks. A single process is world size 1 with the same rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from snapshotkit._format.serialization import RAW, dtype_from_name
from snapshotkit._format.sharded import Box
from snapshotkit._plan.layout import row_pieces, split_payload
from snapshotkit._plan.leaves import RankInfo, ShardedDescription
from snapshotkit._plan.partition import WriteItem, assign_writers, common_patterns, replicated_paths
from snapshotkit.errors import UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class PieceKey:
    """Names a piece of a replicated leaf (``shard_offsets`` None) or of a stored shard box
    identically on every rank: the ``index``-th piece of the leaf or box at ``path``."""

    path: str
    index: int
    shard_offsets: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of a payload."""

    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class Decision:
    """Who writes what, identical on every rank.

    Attributes:
        replicated: logical paths stored once for all ranks.
        owner: the rank that writes each replicated or sharded piece.
        spans: where each such piece lies within its payload.
        sharded: path -> the global tensor and its distinct boxes, in first-seen order.
        differing: paths that match a replicated pattern but differ between ranks -> the
            ranks that disagree with rank 0 (stored per rank instead).
    """

    replicated: frozenset[str]
    owner: Mapping[PieceKey, int]
    spans: Mapping[PieceKey, Span]
    sharded: Mapping[str, ShardedDescription]
    differing: Mapping[str, tuple[int, ...]]

    def pieces(self, path: str, shard_offsets: tuple[int, ...] | None = None) -> list[PieceKey]:
        """The keys of every piece of the replicated leaf, or shard box, at ``path``, in order."""
        keys: list[PieceKey] = []
        while (key := PieceKey(path, len(keys), shard_offsets)) in self.spans:
            keys.append(key)
        return keys


def decide(infos: Sequence[RankInfo], *, chunk_bytes: int) -> Decision:
    """Replicated paths, sharded boxes, and the writer of every replicated or sharded piece.

    Raises:
        UnsupportedValueError: the ranks' shards of a tensor disagree on its global dtype or
            shape, or do not cover it exactly once.
    """
    patterns = common_patterns([info.patterns for info in infos])
    chosen, differing = replicated_paths([info.candidates for info in infos], patterns)
    first = infos[0].candidates
    # A tied alias is replicated only together with the tensor it shares memory with.
    replicated = frozenset(p for p in chosen if first[p].kind != "alias" or first[p].alias_of in chosen)
    items: list[WriteItem[PieceKey]] = []
    spans: dict[PieceKey, Span] = {}
    loads = [info.total_bytes for info in infos]
    for path in sorted(replicated):
        leaf = first[path]
        if leaf.kind in ("alias", "primitive"):
            continue  # an alias reuses its tensor's pieces; primitives are inline in the manifest
        for rank, info in enumerate(infos):
            loads[rank] -= info.candidates[path].nbytes
        if leaf.kind == "tensor" and leaf.serializer == RAW:
            ranges = split_payload(leaf.nbytes, dtype_from_name(leaf.dtype).itemsize, chunk_bytes)
        else:
            ranges = [(0, leaf.nbytes)]  # serialized bytes are never split
        for index, (start, end) in enumerate(ranges):
            key = PieceKey(path, index)
            spans[key] = Span(start, end)
            items.append(WriteItem(key, end - start))
    sharded, holders = _distinct_boxes(infos)
    for path, description in sharded.items():
        itemsize = dtype_from_name(description.dtype).itemsize
        for box in description.boxes:
            for index, (start, end) in enumerate(row_pieces(box[1], itemsize, chunk_bytes)):
                key = PieceKey(path, index, box[0])
                spans[key] = Span(start, end)
                items.append(WriteItem(key, end - start, holders[(path, box)]))
    owner = assign_writers(items, [max(0, load) for load in loads])
    return Decision(replicated, owner, spans, sharded, {p: tuple(r) for p, r in differing.items()})


def _distinct_boxes(
    infos: Sequence[RankInfo],
) -> tuple[dict[str, ShardedDescription], dict[tuple[str, Box], tuple[int, ...]]]:
    """Each sharded tensor with its distinct boxes, and the ranks holding each box."""
    found: dict[str, tuple[str, tuple[int, ...], list[Box]]] = {}
    holders: dict[tuple[str, Box], list[int]] = {}
    for rank, info in enumerate(infos):
        for path, description in info.shards.items():
            dtype, shape, boxes = found.setdefault(path, (description.dtype, description.shape, []))
            if (dtype, shape) != (description.dtype, description.shape):
                raise UnsupportedValueError(
                    f"the sharded tensor at {path!r} is {dtype} {list(shape)} on one rank and {description.dtype} "
                    f"{list(description.shape)} on rank {rank}; every rank must hold shards of the same global tensor"
                )
            for box in description.boxes:
                ranks = holders.setdefault((path, box), [])
                if not ranks:
                    boxes.append(box)
                ranks.append(rank)
    sharded = {}
    for path, (dtype, shape, boxes) in found.items():
        covered = sum(math.prod(sizes) for _, sizes in boxes)
        if covered != math.prod(shape):
            raise UnsupportedValueError(
                f"the shards of {path!r} held by the ranks cover {covered} of its {math.prod(shape)} elements "
                "(overlapping or missing shards); every shard must be held by a rank of the process group"
            )
        sharded[path] = ShardedDescription(dtype, shape, tuple(boxes))
    return sharded, {key: tuple(ranks) for key, ranks in holders.items()}
