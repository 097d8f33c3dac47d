"""What a snapshot holds, from its manifest alone: leaves by logical path, a tree of them, totals by
dtype, and (incremental snapshots) which bytes are stored in it and which are referenced in its bases.

Per-rank state is merged by logical path (its bytes summed over the ranks that hold it, its
dtype and shape those of the lowest rank), so a snapshot of any world size reads as one tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from snapshotkit._format.bases import resolve_base
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import (
    DictEntry,
    Entry,
    ListEntry,
    ObjectEntry,
    PrimitiveEntry,
    ShardedTensorEntry,
    TensorEntry,
    TupleEntry,
    join_path,
    pieces_of,
)


def entry_kind(entry: Entry) -> str:
    """``"tensor"``, ``"sharded_tensor"``, ``"object"``, ``"primitive"``, ``"dict"``,
    ``"ordered_dict"``, ``"list"`` or ``"tuple"``."""
    if isinstance(entry, DictEntry):
        return "ordered_dict" if entry.ordered else "dict"
    if isinstance(entry, TupleEntry):
        return "tuple"
    return entry.kind


def is_container(entry: Entry) -> bool:
    return isinstance(entry, (DictEntry, ListEntry))


def is_empty_container(entry: Entry) -> bool:
    return (isinstance(entry, DictEntry) and not entry.keys) or (isinstance(entry, ListEntry) and entry.length == 0)


def entry_nbytes(entry: Entry) -> int:
    """Stored bytes of an entry's value (0 for primitives, stored inline, and containers)."""
    if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        return entry.nbytes
    if isinstance(entry, ObjectEntry):
        return entry.piece.nbytes
    return 0


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One logical path holding a value (or an empty container).

    Attributes:
        logical_path: the user's key, without a rank.
        kind: see :func:`entry_kind`.
        dtype: a tensor's dtype, None otherwise.
        shape: a tensor's (global) shape, None otherwise.
        nbytes: stored bytes, summed over the ranks holding it.
        sharding: ``"replicated"`` (stored once for every rank), ``"per_rank"`` (each rank its
            own) or ``"sharded"`` (a sharded tensor's boxes).
        ranks: the ranks whose manifest entries hold it (rank 0 for replicated and sharded).
        shards: how many stored boxes a sharded tensor has; None otherwise.
        detail: an object's type, a primitive's type (``"int"``...); None otherwise.
    """

    logical_path: str
    kind: str
    dtype: str | None
    shape: tuple[int, ...] | None
    nbytes: int
    sharding: str
    ranks: tuple[int, ...]
    shards: int | None
    detail: str | None


def leaves(metadata: SnapshotMetadata) -> list[Leaf]:
    """Every leaf of the snapshot by logical path, in the order the manifest first names them."""
    found: dict[str, Leaf] = {}
    for key, entry in metadata.manifest.items():
        if is_container(entry) and not is_empty_container(entry):
            continue
        rank_text, _, logical_path = key.partition("/")
        rank = int(rank_text)
        known = found.get(logical_path)
        if known is not None:
            found[logical_path] = dataclasses.replace(
                known, nbytes=known.nbytes + entry_nbytes(entry), ranks=(*known.ranks, rank)
            )
            continue
        sharded = isinstance(entry, ShardedTensorEntry)
        replicated = bool(getattr(entry, "replicated", False))
        detail = entry.obj_type if isinstance(entry, ObjectEntry) else None
        if isinstance(entry, PrimitiveEntry):
            detail = entry.value_type
        found[logical_path] = Leaf(
            logical_path=logical_path,
            kind=entry_kind(entry),
            dtype=getattr(entry, "dtype", None),
            shape=getattr(entry, "shape", None),
            nbytes=entry_nbytes(entry),
            sharding="sharded" if sharded else "replicated" if replicated else "per_rank",
            ranks=(rank,),
            shards=len(entry.shards) if isinstance(entry, ShardedTensorEntry) else None,
            detail=detail,
        )
    return list(found.values())


@dataclasses.dataclass(frozen=True)
class Containers:
    """The containers of a snapshot by logical path: each one's kind and its children in order
    (the lowest rank's kind; children of every rank, in order of first appearance)."""

    kinds: dict[str, str]
    children: dict[str, list[str]]


def containers(metadata: SnapshotMetadata) -> Containers:
    kinds: dict[str, str] = {}
    children: dict[str, dict[str, None]] = {"": {}}
    for key, entry in metadata.manifest.items():
        path = key.partition("/")[2]
        if "/" not in path:
            children[""].setdefault(path)
        if isinstance(entry, DictEntry):
            names = [join_path(path, k) for k in entry.keys]
        elif isinstance(entry, ListEntry):
            names = [join_path(path, i) for i in range(entry.length)]
        else:
            continue
        kinds.setdefault(path, entry_kind(entry))
        known = children.setdefault(path, {})
        for name in names:
            known.setdefault(name)
    return Containers(kinds, {path: list(names) for path, names in children.items()})


@dataclasses.dataclass(frozen=True)
class TreeNode:
    """A node of the tree of logical paths.

    Attributes:
        path: its logical path.
        depth: 1 for a top-level (``app_state``) key.
        kind: its kind (a container's, or the leaf's).
        leaf: the leaf, for a leaf; None for a container.
        leaves: leaves at or below it.
        nbytes: stored bytes at or below it.
        truncated: whether nodes below it are left out (deeper than the depth asked for).
    """

    path: str
    depth: int
    kind: str
    leaf: Leaf | None
    leaves: int
    nbytes: int
    truncated: bool


def tree(found: Sequence[Leaf], known: Containers, depth: int | None) -> list[TreeNode]:
    """The nodes down to ``depth`` (None: all), parents before children, in the containers' order."""
    children: dict[str, list[str]] = {"": []}
    totals: dict[str, tuple[int, int]] = {}
    by_path = {leaf.logical_path: leaf for leaf in found}
    for leaf in found:
        parts = leaf.logical_path.split("/")
        for level in range(len(parts)):
            path, parent = "/".join(parts[: level + 1]), "/".join(parts[:level])
            if path not in children:
                children[path] = []
                children[parent].append(path)
            count, nbytes = totals.get(path, (0, 0))
            totals[path] = (count + 1, nbytes + leaf.nbytes)
    for path, names in children.items():
        order = {name: index for index, name in enumerate(known.children.get(path, ()))}
        names.sort(key=lambda name: order.get(name, len(order)))
    nodes: list[TreeNode] = []

    def visit(path: str, level: int) -> None:
        leaf = by_path.get(path)
        below = children[path]
        cut = depth is not None and level >= depth and bool(below)
        kind = leaf.kind if leaf is not None else known.kinds.get(path, "dict")
        count, nbytes = totals[path]
        nodes.append(TreeNode(path, level, kind, leaf, count, nbytes, cut))
        if not cut:
            for child in below:
                visit(child, level + 1)

    for top in children[""]:
        visit(top, 1)
    return nodes


@dataclasses.dataclass(frozen=True)
class DtypeTotal:
    """Stored tensors of one dtype (each rank's copy of per-rank state counts): how many, how many bytes."""

    dtype: str
    count: int
    nbytes: int


def dtype_totals(metadata: SnapshotMetadata) -> list[DtypeTotal]:
    """Tensors by dtype, largest total first; objects are counted under ``"object"``."""
    totals: dict[str, tuple[int, int]] = {}
    for entry in metadata.manifest.values():
        if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
            name = entry.dtype
        elif isinstance(entry, ObjectEntry):
            name = "object"
        else:
            continue
        count, nbytes = totals.get(name, (0, 0))
        totals[name] = (count + 1, nbytes + entry_nbytes(entry))
    ordered = sorted(totals.items(), key=lambda item: (-item[1][1], item[0]))
    return [DtypeTotal(name, count, nbytes) for name, (count, nbytes) in ordered]


@dataclasses.dataclass(frozen=True)
class BaseUse:
    """A base an incremental snapshot references: its base location (``"../step_100"``), the path
    it resolves to, the snapshot id the reference was made against, and what is read from it."""

    location: str
    path: str
    snapshot_id: str
    nbytes: int
    pieces: int


@dataclasses.dataclass(frozen=True)
class StorageSplit:
    """Where a snapshot's bytes are: ``stored_bytes`` in its own data objects, ``referenced_bytes``
    in its ``bases`` (each distinct piece counted once, however many entries hold it)."""

    stored_bytes: int
    referenced_bytes: int
    bases: tuple[BaseUse, ...]

    @property
    def self_contained(self) -> bool:
        """Whether every byte is in the snapshot itself (no base is referenced)."""
        return not self.bases


def storage_split(metadata: SnapshotMetadata, path: str) -> StorageSplit:
    """The :class:`StorageSplit` of the snapshot at ``path``; bases in the manifest's order."""
    seen: set[tuple[str, tuple[int, int], str]] = set()
    stored = 0
    referenced: dict[str, tuple[int, int]] = dict.fromkeys(metadata.bases, (0, 0))
    for entry in metadata.manifest.values():
        for piece in pieces_of(entry):
            key = (piece.address, piece.byte_range, piece.checksum)
            if key in seen:
                continue
            seen.add(key)
            if piece.base is None:
                stored += piece.nbytes
            else:
                nbytes, count = referenced.get(piece.base, (0, 0))
                referenced[piece.base] = (nbytes + piece.nbytes, count + 1)
    bases = tuple(
        BaseUse(base, resolve_base(path, base), metadata.bases.get(base, ""), nbytes, count)
        for base, (nbytes, count) in referenced.items()
    )
    return StorageSplit(stored, sum(use.nbytes for use in bases), bases)
