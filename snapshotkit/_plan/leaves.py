"""What one rank holds, described for planning, and what ranks tell each other about it.

A take flattens the app state into *leaves* keyed by logical path. Every stored byte of a leaf
belongs to a *payload*: a tensor's elements or an object's serialized bytes. Planning only
needs sizes and kinds, so the descriptions here are small, typed and picklable (the
:class:`RankInfo` of every rank travels to every other rank before anything is written).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from snapshotkit._format.entries import ContainerEntry, PrimitiveEntry
from snapshotkit._format.serialization import is_zero_copy_source
from snapshotkit._format.sharded import Box
from snapshotkit._plan.grid import Grid
from snapshotkit._plan.partition import matches_any

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True, slots=True)
class Payload:
    """The bytes of one stored value: a raw tensor's elements, or serialized ``data``.

    Attributes:
        nbytes: its size.
        itemsize: pieces are cut on multiples of this (a tensor's element size; a serialized
            blob is one indivisible element).
        tensor: the tensor whose elements it is, or None.
        data: the serialized bytes, or None.
        address: where a tensor's elements start in memory, when they can be written from there
            as they are (a non-empty contiguous CPU tensor without a lazy conj/neg bit), found
            once when the tensor is described; else 0 (staging copies them). IMPORTANT: like a
            :func:`~snapshotkit._format.serialization.byte_view`, it is valid only while the
            tensor lives and is not resized: the caller of a take holds both until it returns.
    """

    nbytes: int
    itemsize: int = 1
    tensor: torch.Tensor | None = None
    data: bytes | None = None
    address: int = 0

    @property
    def zero_copy(self) -> bool:
        """Whether its memory can be written as it is (no staging copy)."""
        return self.data is not None or self.address != 0

    @classmethod
    def of_tensor(cls, tensor: torch.Tensor, *, numel: int | None = None, address: int | None = None) -> Payload:
        """The payload of ``tensor``'s elements (``numel`` and ``address``: its ``numel()`` and
        ``data_ptr()``, when the caller has them already)."""
        itemsize = tensor.element_size()
        if numel is None:
            numel = tensor.numel()
        if numel and is_zero_copy_source(tensor):
            return cls(numel * itemsize, itemsize, tensor, None, tensor.data_ptr() if address is None else address)
        return cls(numel * itemsize, itemsize, tensor)

    @classmethod
    def of_bytes(cls, data: bytes) -> Payload:
        return cls(len(data), max(1, len(data)), data=data)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorLeaf:
    """A tensor stored whole by this rank (``payload`` indexes :attr:`LocalState.payloads`)."""

    payload: int
    dtype: str
    shape: tuple[int, ...]
    serializer: str
    alias_of: str | None = None  # the first path whose payload this one shares (tied weights)


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectLeaf:
    """A serialized object."""

    payload: int
    obj_type: str


@dataclasses.dataclass(frozen=True, slots=True)
class ShardBox:
    """One local box of a sharded tensor and the payload holding its elements."""

    box: Box
    payload: int


@dataclasses.dataclass(frozen=True, slots=True)
class ShardedLeaf:
    """The local boxes of a ``DTensor``/``ShardedTensor`` of global ``dtype`` and ``shape``.

    ``grid``: a ``DTensor``'s mesh and placements, when they give exactly ``boxes`` on this rank
    (checked where the leaf is described): the ranks then describe it to each other by the grid.
    """

    dtype: str
    shape: tuple[int, ...]
    layout: str
    boxes: tuple[ShardBox, ...]
    grid: Grid | None = None


Leaf = TensorLeaf | ObjectLeaf | ShardedLeaf | PrimitiveEntry


@dataclasses.dataclass(frozen=True)
class LocalState:
    """One rank's flattened state: containers and leaves by logical path, and their payloads."""

    containers: Mapping[str, ContainerEntry]
    leaves: Mapping[str, Leaf]
    payloads: Sequence[Payload]

    def sharded_layouts(self) -> dict[str, str]:
        """Logical path -> layout text of every sharded leaf (informative, for the manifest)."""
        return {path: leaf.layout for path, leaf in self.leaves.items() if isinstance(leaf, ShardedLeaf)}


@dataclasses.dataclass(frozen=True)
class LeafSignature:
    """What must be equal on every rank for a leaf to be stored once as replicated.

    ``kind`` is ``"tensor"``, ``"alias"`` (a tensor tied to ``alias_of``), ``"object"`` or
    ``"primitive"``; the other fields are those the kind has.
    """

    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    serializer: str = ""
    nbytes: int = 0
    alias_of: str = ""
    obj_type: str = ""
    value: str = ""  # a primitive's repr


def signature(local: LocalState, leaf: Leaf) -> LeafSignature:
    """The :class:`LeafSignature` of a (non-sharded) leaf of ``local``."""
    if isinstance(leaf, TensorLeaf):
        if leaf.alias_of is not None:
            return LeafSignature("alias", leaf.dtype, leaf.shape, alias_of=leaf.alias_of)
        return LeafSignature("tensor", leaf.dtype, leaf.shape, leaf.serializer, local.payloads[leaf.payload].nbytes)
    if isinstance(leaf, ObjectLeaf):
        return LeafSignature("object", nbytes=local.payloads[leaf.payload].nbytes, obj_type=leaf.obj_type)
    assert isinstance(leaf, PrimitiveEntry), "sharded leaves have no signature"
    return LeafSignature("primitive", obj_type=leaf.value_type, value=repr(leaf.value))


@dataclasses.dataclass(frozen=True)
class ShardedDescription:
    """A sharded tensor as the ranks describe it: global dtype and shape, and boxes.

    In a :class:`RankInfo`, a ``grid`` (then ``boxes`` is empty) stands for the boxes the grid
    gives the rank (:mod:`snapshotkit._plan.grid`, split as a take stores them): the same
    description on every rank of the mesh.
    """

    dtype: str
    shape: tuple[int, ...]
    boxes: tuple[Box, ...]
    grid: Grid | None = None


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """What a rank tells the others before anything is written (small: no tensor bytes).

    Attributes:
        path: where this rank was asked to take the snapshot (rank 0's wins).
        patterns: the ``replicated=`` globs this rank passed (plus DDP's).
        candidates: leaf path -> signature, for this rank's leaves matching its patterns.
        shards: path -> description of every sharded leaf.
        total_bytes: payload bytes of every non-sharded leaf (what it writes if nothing is shared).
        take_id: a random id; rank 0's names the data objects of every rank.
    """

    path: str
    patterns: tuple[str, ...]
    candidates: Mapping[str, LeafSignature]
    shards: Mapping[str, ShardedDescription]
    total_bytes: int
    take_id: str


def rank_info(local: LocalState, path: str, patterns: Sequence[str], take_id: str) -> RankInfo:
    """This rank's :class:`RankInfo` for the leaves of ``local``."""
    candidates: dict[str, LeafSignature] = {}
    shards: dict[str, ShardedDescription] = {}
    sharded_payloads: set[int] = set()
    grids: dict[Grid, Grid] = {}  # equal grids as one object: pickled once (the pickler's memo)
    for leaf_path, leaf in local.leaves.items():
        if isinstance(leaf, ShardedLeaf):
            if leaf.grid is not None:
                grid = grids.setdefault(leaf.grid, leaf.grid)
                shards[leaf_path] = ShardedDescription(leaf.dtype, leaf.shape, (), grid)
            else:
                shards[leaf_path] = ShardedDescription(leaf.dtype, leaf.shape, tuple(b.box for b in leaf.boxes))
            sharded_payloads.update(b.payload for b in leaf.boxes)
        elif patterns and matches_any(leaf_path, patterns):
            candidates[leaf_path] = signature(local, leaf)
    total = sum(p.nbytes for i, p in enumerate(local.payloads) if i not in sharded_payloads)
    return RankInfo(path, tuple(patterns), candidates, shards, total, take_id)
