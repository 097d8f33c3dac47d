"""The decide of snapshotkit before issue 27 (one RankInfo per rank, a PieceKey per piece), kept
verbatim as the reference the vectorized :func:`snapshotkit._plan.decide.decide` is compared with
(``tests/plan/test_decide_reference.py``). Only this docstring and the imports differ."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from snapshotkit._format.serialization import RAW, dtype_from_name
from snapshotkit._format.sharded import Box
from snapshotkit._plan.decide import PieceKey
from snapshotkit._plan.layout import Span, row_pieces, split_payload
from snapshotkit._plan.leaves import LeafSignature, RankInfo, ShardedDescription
from snapshotkit._plan.partition import WriteItem, assign_writers, common_patterns, replicated_paths
from snapshotkit.errors import UnsupportedValueError


@dataclasses.dataclass(frozen=True)
class Decision:
    """Who writes what, identical on every rank.

    Attributes:
        replicated: logical paths stored once for all ranks.
        owner: the rank that writes each replicated or sharded piece.
        spans: where each such piece lies within its payload; the pieces of a leaf or box
            (indices 0, 1, ...) cover its payload in order. Exactly the keys of ``owner``.
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


def decide(infos: Sequence[RankInfo], *, chunk_bytes: int, partial_shards: bool = False) -> Decision:
    """Replicated paths, sharded boxes, and the writer of every replicated or sharded piece.

    ``partial_shards``: sharded tensors may be covered only in part (see :func:`distinct_boxes`).

    Raises:
        UnsupportedValueError: the ranks' shards of a tensor disagree on its global dtype or
            shape, or do not cover it exactly once.
    """
    patterns = common_patterns([info.patterns for info in infos])
    offered = replicated_paths([info.candidates for info in infos], patterns)
    first = infos[0].candidates
    # A tied alias is replicated only together with the tensor it shares memory with.
    replicated = frozenset(p for p in offered.chosen if first[p].kind != "alias" or first[p].alias_of in offered.chosen)
    items: list[WriteItem[PieceKey]] = []
    spans: dict[PieceKey, Span] = {}
    stored = [path for path in sorted(replicated) if first[path].kind not in ("alias", "primitive")]
    # a rank writes its own copy of none of them: only its share of their pieces
    loads = [info.total_bytes - _bytes_of(info.candidates, stored) for info in infos]
    for path in stored:  # an alias reuses its tensor's pieces; primitives are inline in the manifest
        leaf = first[path]
        if leaf.kind == "tensor" and leaf.serializer == RAW:
            ranges = split_payload(leaf.nbytes, dtype_from_name(leaf.dtype).itemsize, chunk_bytes)
        else:
            ranges = [Span(0, leaf.nbytes)]  # serialized bytes are never split
        for index, span in enumerate(ranges):
            key = PieceKey(path, index)
            spans[key] = span
            items.append(WriteItem(key, span.nbytes))
    boxes = distinct_boxes(infos, partial=partial_shards)
    row_spans: dict[tuple[tuple[int, ...], int], list[Span]] = {}  # the boxes of a tensor mostly share sizes
    for path, description in boxes.sharded.items():
        itemsize = dtype_from_name(description.dtype).itemsize
        for box, holders in boxes.holders[path].items():  # in the order of description.boxes
            if (box_spans := row_spans.get((box.sizes, itemsize))) is None:
                box_spans = row_spans[box.sizes, itemsize] = row_pieces(box.sizes, itemsize, chunk_bytes)
            for index, span in enumerate(box_spans):
                key = PieceKey(path, index, box.offsets)
                spans[key] = span
                items.append(WriteItem(key, span.nbytes, holders))
    owner = assign_writers(items, [max(0, load) for load in loads])
    return Decision(replicated, owner, spans, boxes.sharded, offered.differing)


def _bytes_of(candidates: Mapping[str, LeafSignature], paths: Sequence[str]) -> int:
    return sum(candidates[path].nbytes for path in paths)


@dataclasses.dataclass(frozen=True)
class DistinctBoxes:
    """The sharded tensors of all ranks, each box counted once.

    Attributes:
        sharded: path -> the global tensor and its distinct boxes, in first-seen order (by rank,
            then by each rank's order).
        holders: path -> box -> the ranks holding that box, in rank order.
    """

    sharded: Mapping[str, ShardedDescription]
    holders: Mapping[str, Mapping[Box, tuple[int, ...]]]


def distinct_boxes(infos: Sequence[RankInfo], *, partial: bool = False) -> DistinctBoxes:
    """Each sharded tensor with its distinct boxes, and the ranks holding each box.

    ``partial``: the ranks hold part of each tensor only (a DCP rank's own chunks, whose union
    over every rank's take is checked when the ranks' manifests are merged); no coverage check.

    Raises:
        UnsupportedValueError: the ranks' shards of a tensor disagree on its global dtype or
            shape, or their distinct boxes do not cover it exactly once (by element count).
    """
    found: dict[str, ShardedDescription] = {}
    # Keyed by a box's fields, equal exactly when the boxes are: a tuple hashes in C, a Box in Python.
    holders: dict[str, dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[Box, list[int]]]] = {}
    for rank, info in enumerate(infos):
        for path, description in info.shards.items():
            if (seen := found.get(path)) is None:
                seen = found[path] = ShardedDescription(description.dtype, description.shape, ())
            if seen.dtype != description.dtype or seen.shape != description.shape:
                raise UnsupportedValueError(
                    f"the sharded tensor at {path!r} is {seen.dtype} {list(seen.shape)} on one rank and "
                    f"{description.dtype} {list(description.shape)} on rank {rank}; every rank must hold "
                    "shards of the same global tensor"
                )
            if (by_box := holders.get(path)) is None:
                by_box = holders[path] = {}
            for box in description.boxes:
                if (held := by_box.get((box.offsets, box.sizes))) is None:
                    by_box[box.offsets, box.sizes] = (box, [rank])
                else:
                    held[1].append(rank)
    sharded = {}
    for path, seen in found.items():
        boxes = tuple(box for box, _ in holders[path].values())  # dicts keep first-seen order
        covered = sum(math.prod(box.sizes) for box in boxes)
        if covered != math.prod(seen.shape) and not (partial and covered < math.prod(seen.shape)):
            raise UnsupportedValueError(
                f"the shards of {path!r} held by the ranks cover {covered} of its {math.prod(seen.shape)} elements "
                "(overlapping or missing shards); every shard must be held by a rank of the process group"
            )
        sharded[path] = ShardedDescription(seen.dtype, seen.shape, boxes)
    return DistinctBoxes(
        sharded, {path: {box: tuple(r) for box, r in by_box.values()} for path, by_box in holders.items()}
    )
