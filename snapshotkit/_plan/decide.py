"""The shared decision of a multi-rank take: what is replicated, and who writes which piece.

Every rank computes :func:`decide` from every rank's description (the
:class:`~snapshotkit._plan.gathered.Gathered` view the first take's exchange delivers, or a
:class:`~snapshotkit._plan.leaves.RankInfo` per rank) and gets the same :class:`Decision`, so no
rank decides for the others and nothing more is sent. Replicated leaves and the distinct boxes of
sharded tensors are cut into pieces (see :mod:`snapshotkit._plan.layout`) that
:func:`~snapshotkit._plan.assign.assign` spreads over the ranks exactly as
:func:`~snapshotkit._plan.partition.assign_writers` would. A single process is world size 1
with the same rules.

The work is per distinct item, not per rank: replicated candidates are compared once per
distinct part, a sharded tensor's boxes come as arrays (:func:`~snapshotkit._plan.gathered.box_tables`,
one table for the tensors described alike), its pieces are laid out once per distinct box size,
and the owners of its pieces are an array. Only replicated pieces are
:class:`PieceKey` objects; a sharded piece's key is made when asked for
(:meth:`Decision.shares`, :attr:`Decision.owner`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from snapshotkit._format.serialization import RAW, dtype_from_name
from snapshotkit._plan.assign import ANY_RANK, SOME_RANKS, Items, assign
from snapshotkit._plan.gathered import BoxTable, Gathered, box_tables, equal_fields
from snapshotkit._plan.layout import Span, row_pieces, split_payload
from snapshotkit._plan.leaves import RankInfo, ShardedDescription
from snapshotkit._plan.partition import common_patterns, replicated_paths

Array = np.ndarray[Any, Any]


@dataclasses.dataclass(frozen=True)
class PieceKey:
    """Names a piece of a replicated leaf (``shard_offsets`` None) or of a stored shard box
    identically on every rank: the ``index``-th piece of the leaf or box at ``path``.

    IMPORTANT: a box is named by its offsets alone. That is unique because the distinct boxes of
    a tensor do not overlap; :func:`decide` checks that they cover it exactly once by element
    count only, which boxes from DTensor/ShardedTensor placements satisfy but hand-made
    overlapping boxes with a matching count would not be caught by.
    """

    path: str
    index: int
    shard_offsets: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        # The dataclass's own text, without its recursion guard: assign_writers orders equal-sized
        # pieces by repr, millions of them at 16k ranks.
        return f"PieceKey(path={self.path!r}, index={self.index!r}, shard_offsets={self.shard_offsets!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class BoxPieces:
    """How the distinct boxes of a :class:`~snapshotkit._plan.gathered.BoxTable` are cut into
    pieces (whole dim-0 rows, :func:`~snapshotkit._plan.layout.row_pieces`): box ``b``'s pieces
    are ``first[b]`` to ``first[b + 1] - 1``, each with its byte ``start`` and ``end`` within the box."""

    first: Array
    start: Array
    end: Array

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoxPieces) and equal_fields(self, other)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedPieces:
    """One sharded tensor in a :class:`Decision`: its distinct boxes, their pieces, and who writes
    each piece (``owner``, per piece of ``pieces``)."""

    table: BoxTable
    pieces: BoxPieces
    owner: Array

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardedPieces) and equal_fields(self, other)

    def description(self) -> ShardedDescription:
        return ShardedDescription(self.table.dtype, self.table.shape, self.table.boxes)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Who writes what, identical on every rank.

    Attributes:
        replicated: logical paths stored once for all ranks.
        replicated_owner: the rank that writes each piece of a replicated leaf.
        replicated_spans: where each such piece lies within its payload; the pieces of a leaf
            (indices 0, 1, ...) cover it in order. Exactly the keys of ``replicated_owner``.
        sharded_pieces: path -> the tensor's distinct boxes (in first-seen order), their pieces
            and owners.
        differing: paths that match a replicated pattern but differ between ranks -> the
            ranks that disagree with rank 0 (stored per rank instead).
    """

    replicated: frozenset[str]
    replicated_owner: Mapping[PieceKey, int]
    replicated_spans: Mapping[PieceKey, Span]
    sharded_pieces: Mapping[str, ShardedPieces]
    differing: Mapping[str, tuple[int, ...]]

    def shares(self, path: str, shard_offsets: tuple[int, ...] | None = None) -> Iterator[tuple[PieceKey, Span, int]]:
        """Each piece of the replicated leaf, or shard box, at ``path`` in order: its key, span and writer."""
        if shard_offsets is None:
            index = 0
            while (key := PieceKey(path, index)) in self.replicated_spans:
                yield key, self.replicated_spans[key], self.replicated_owner[key]
                index += 1
            return
        sharded = self.sharded_pieces.get(path)
        box = None if sharded is None else sharded.table.index.get(shard_offsets)
        if sharded is None or box is None:
            return
        pieces = sharded.pieces
        low, high = int(pieces.first[box]), int(pieces.first[box + 1])
        starts, ends = pieces.start[low:high].tolist(), pieces.end[low:high].tolist()
        owners = sharded.owner[low:high].tolist()
        for index in range(high - low):
            yield PieceKey(path, index, shard_offsets), Span(starts[index], ends[index]), owners[index]

    @functools.cached_property
    def sharded_starts(self) -> dict[str, int]:
        """Path -> the position of its first piece in the decision's order of sharded pieces
        (tensors in :attr:`sharded_pieces` order, then boxes, then pieces)."""
        starts, at = {}, 0
        for path, sharded in self.sharded_pieces.items():
            starts[path] = at
            at += len(sharded.owner)
        return starts

    def sharded_position(self, key: PieceKey) -> int:
        """The position of a sharded piece in the decision's order (see :attr:`sharded_starts`)."""
        assert key.shard_offsets is not None
        sharded = self.sharded_pieces[key.path]
        box = sharded.table.index[key.shard_offsets]
        return self.sharded_starts[key.path] + int(sharded.pieces.first[box]) + key.index

    def pieces(self, path: str, shard_offsets: tuple[int, ...] | None = None) -> list[PieceKey]:
        """The keys of every piece of the replicated leaf, or shard box, at ``path``, in order."""
        return [key for key, _, _ in self.shares(path, shard_offsets)]

    @property
    def sharded(self) -> dict[str, ShardedDescription]:
        """Path -> the global tensor and its distinct boxes, in first-seen order (builds every box)."""
        return {path: sharded.description() for path, sharded in self.sharded_pieces.items()}

    @functools.cached_property
    def owner(self) -> Mapping[PieceKey, int]:
        """The rank that writes every replicated or sharded piece (a key per piece: for tests and tools)."""
        return {key: owner for key, _, owner in self.every_piece()}

    @functools.cached_property
    def spans(self) -> Mapping[PieceKey, Span]:
        """Where every replicated or sharded piece lies within its payload. Exactly the keys of :attr:`owner`."""
        return {key: span for key, span, _ in self.every_piece()}

    def every_piece(self) -> Iterator[tuple[PieceKey, Span, int]]:
        """Every replicated or sharded piece: its key, span and writer (a key made per piece)."""
        for key, owner in self.replicated_owner.items():
            yield key, self.replicated_spans[key], owner
        for path, sharded in self.sharded_pieces.items():
            for offsets in sharded.table.offset_tuples:
                yield from self.shares(path, offsets)


def decide(infos: Sequence[RankInfo] | Gathered, *, chunk_bytes: int, partial_shards: bool = False) -> Decision:
    """Replicated paths, sharded boxes, and the writer of every replicated or sharded piece.

    ``infos``: every rank's description (the exchange's :class:`~snapshotkit._plan.gathered.Gathered`
    view, or one :class:`~snapshotkit._plan.leaves.RankInfo` per rank).
    ``partial_shards``: sharded tensors may be covered only in part (see
    :func:`~snapshotkit._plan.gathered.box_tables`).

    Raises:
        UnsupportedValueError: the ranks' shards of a tensor disagree on its global dtype or
            shape, or do not cover it exactly once.
    """
    gathered = infos if isinstance(infos, Gathered) else Gathered.of_infos(infos)
    parts = gathered.replicated_parts  # rank 0's first
    patterns = common_patterns([part.patterns for part in parts])
    offered = replicated_paths([part.candidates for part in parts], patterns)
    differing = {
        path: tuple(sorted(r for part in disagree for r in gathered.replicated_ranks[part].tolist()))
        for path, disagree in offered.differing.items()
    }
    first = parts[int(gathered.replicated_of[0])].candidates
    # A tied alias is replicated only together with the tensor it shares memory with.
    replicated = frozenset(p for p in offered.chosen if first[p].kind != "alias" or first[p].alias_of in offered.chosen)
    stored = [path for path in sorted(replicated) if first[path].kind not in ("alias", "primitive")]
    # a rank writes its own copy of none of them: only its share of their pieces
    stored_bytes = np.asarray([sum(part.candidates[p].nbytes for p in stored) for part in parts], dtype=np.int64)
    loads = np.maximum(0, gathered.total_bytes - stored_bytes[gathered.replicated_of])
    keys: list[PieceKey] = []
    spans: dict[PieceKey, Span] = {}
    for path in stored:  # an alias reuses its tensor's pieces; primitives are inline in the manifest
        leaf = first[path]
        if leaf.kind == "tensor" and leaf.serializer == RAW:
            ranges = split_payload(leaf.nbytes, dtype_from_name(leaf.dtype).itemsize, chunk_bytes)
        else:
            ranges = [Span(0, leaf.nbytes)]  # serialized bytes are never split
        for index, span in enumerate(ranges):
            key = PieceKey(path, index)
            spans[key] = span
            keys.append(key)
    tables = box_tables(gathered, partial=partial_shards)
    laid_out: dict[int, BoxPieces] = {}  # tensors sharing a table share its pieces
    paths = list(tables)
    pieces = []
    for table in tables.values():
        if (cut := laid_out.get(id(table))) is None:
            cut = laid_out[id(table)] = _box_pieces(table, chunk_bytes)
        pieces.append(cut)
    items = _items(keys, spans, paths, [tables[p] for p in paths], pieces)
    owner = assign(items, loads)
    replicated_owner = dict(zip(keys, owner[: len(keys)].tolist(), strict=True))
    sharded: dict[str, ShardedPieces] = {}
    at = len(keys)
    for path, cut in zip(paths, pieces, strict=True):
        count = len(cut.start)
        sharded[path] = ShardedPieces(tables[path], cut, owner[at : at + count])
        at += count
    return Decision(replicated, replicated_owner, spans, sharded, differing)


def _box_pieces(table: BoxTable, chunk_bytes: int) -> BoxPieces:
    """Each distinct box's pieces, laid out once per distinct box size."""
    itemsize = dtype_from_name(table.dtype).itemsize
    if not len(table):
        empty = np.zeros(0, dtype=np.int64)
        return BoxPieces(np.zeros(1, dtype=np.int64), empty, empty)
    if table.sizes.shape[1] == 0:  # 0-d: every box is the one element
        kinds, inverse = table.sizes[:1], np.zeros(len(table), dtype=np.int64)
    else:
        kinds, inverse = np.unique(table.sizes, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    cuts = [row_pieces(tuple(sizes), itemsize, chunk_bytes) for sizes in kinds.tolist()]
    counts = np.asarray([len(c) for c in cuts], dtype=np.int64)[inverse]
    first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    start = np.empty(int(first[-1]), dtype=np.int64)
    end = np.empty(int(first[-1]), dtype=np.int64)
    for kind, cut in enumerate(cuts):
        if not cut:
            continue
        boxes = np.flatnonzero(inverse == kind)
        at = (first[boxes][:, None] + np.arange(len(cut))[None, :]).reshape(-1)
        start[at] = np.tile([span.start for span in cut], len(boxes))
        end[at] = np.tile([span.end for span in cut], len(boxes))
    return BoxPieces(first, start, end)


def _items(
    keys: list[PieceKey],
    spans: Mapping[PieceKey, Span],
    paths: list[str],
    tables: list[BoxTable],
    pieces: list[BoxPieces],
) -> Items:
    """Replicated pieces (any rank writes them), then each sharded tensor's pieces (their box's holders)."""
    nbytes = [np.asarray([spans[key].nbytes for key in keys], dtype=np.int64)]
    holder = [np.full(len(keys), ANY_RANK, dtype=np.int64)]
    box_of: list[Array] = []
    for table, cut in zip(tables, pieces, strict=True):
        box = np.repeat(np.arange(len(table)), np.diff(cut.first))
        counts = np.diff(table.holder_start)
        only = np.where(counts == 1, table.holder_ranks[table.holder_start[:-1]], SOME_RANKS)  # every box has a holder
        nbytes.append(cut.end - cut.start)
        holder.append(only[box])
        box_of.append(box)
    starts = np.cumsum([len(keys), *(len(b) for b in box_of)])

    def locate(item: int) -> tuple[int, int]:
        """(tensor, piece within it) of a sharded item."""
        tensor = int(np.searchsorted(starts, item, side="right")) - 1
        return tensor, item - int(starts[tensor])

    def holders_of(item: int) -> Array:
        tensor, piece = locate(item)
        table = tables[tensor]
        box = int(box_of[tensor][piece])
        return table.holder_ranks[table.holder_start[box] : table.holder_start[box + 1]]

    def key_text(item: int) -> str:
        if item < len(keys):
            return repr(keys[item])
        tensor, piece = locate(item)
        box = int(box_of[tensor][piece])
        index = piece - int(pieces[tensor].first[box])
        return repr(PieceKey(paths[tensor], index, tables[tensor].offset_tuples[box]))

    return Items(np.concatenate(nbytes), np.concatenate(holder), holders_of, key_text)
