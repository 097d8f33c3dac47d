"""A rank's view of a version-5 manifest in which tensors stay column indices until needed.

:func:`rank_view` of :mod:`.plan` builds an entry object per logical path. For a version-5
manifest (:class:`~snapshotkit._format.columnar.ColumnarManifest`), :func:`column_rank_view`
gives the same view as a :class:`ColumnView`: containers and the other rows as entries, tensors
as their index into :class:`~snapshotkit._format.tensor_columns.TensorColumns`. Planning a
restore (:func:`plan_column_leaves`) fills plain contiguous CPU destinations from one raw piece
straight from the columns; every other tensor is built and planned as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from snapshotkit._format.columnar import KIND_RAW, KIND_ROW, ColumnarManifest, make_piece
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import DictEntry, Entry, ListEntry, Piece, is_shared
from snapshotkit._format.tensor_columns import TensorColumns
from snapshotkit._restore.place import LeafLoader, dtype_name_of


class _Lists:
    """The columns planning reads per entry, as Python lists (one conversion of each column)."""

    def __init__(self, c: TensorColumns) -> None:
        self.kind, self.dtype, self.replicated = c.kind.tolist(), c.dtype.tolist(), c.replicated.tolist()
        self.piece_offsets, self.dim_offsets, self.dims = (
            c.piece_offsets.tolist(),
            c.dim_offsets.tolist(),
            c.dims.tolist(),
        )
        self.length, self.start, self.checksum = c.length.tolist(), c.start.tolist(), c.checksum.tolist()
        self.location, self.base = c.location.tolist(), c.base.tolist()
        self.hexes, self.locations, self.bases = c.hashes.hex(), c.locations, c.bases

    def piece(self, j: int) -> Piece:
        """Piece ``j``, as the manifest's entry holds it."""
        digest = self.hexes[32 * j : 32 * j + 32]
        return make_piece(
            self.locations[self.location[j]],
            self.start[j],
            self.length[j],
            self.checksum[j],
            digest,
            self.bases[self.base[j]],
        )


class ColumnView(Mapping[str, Entry]):
    """``logical path -> entry`` as :func:`~.plan.rank_view` gives it; a tensor's entry is built
    only when looked up (:attr:`slots` holds its column index instead)."""

    def __init__(self, columns: TensorColumns, slots: dict[str, Entry | int], lists: _Lists | None = None) -> None:
        self.columns, self.slots = columns, slots
        self.lists = _Lists(columns) if lists is None else lists

    def __getitem__(self, path: str) -> Entry:
        slot = self.slots[path]
        return self.columns.entry(slot) if type(slot) is int else slot  # type: ignore[return-value]

    def __contains__(self, path: object) -> bool:
        return path in self.slots

    def __iter__(self) -> Iterator[str]:
        return iter(self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def is_shared(self, path: str) -> bool:
        """Whether every rank reads ``path`` from rank 0 (:func:`~snapshotkit._format.entries.is_shared`)."""
        slot = self.slots.get(path)
        if type(slot) is int:
            return bool(self.lists.replicated[slot])
        return slot is not None and is_shared(slot)  # type: ignore[arg-type]

    def subtree(self, root: str) -> tuple[dict[str, DictEntry | ListEntry], ColumnView]:
        """The containers and leaves at or below ``root`` (:func:`~.plan.subtree`)."""
        containers: dict[str, DictEntry | ListEntry] = {}
        leaves: dict[str, Entry | int] = {}
        below = root + "/"
        for path, slot in self.slots.items():
            if path == root or path.startswith(below):
                if isinstance(slot, (DictEntry, ListEntry)):
                    containers[path] = slot
                else:
                    leaves[path] = slot
        return containers, ColumnView(self.columns, leaves, self.lists)


def column_rank_view(metadata: SnapshotMetadata, rank: int) -> ColumnView | None:
    """:func:`~.plan.rank_view` for a version-5 manifest and a rank that took part in the take,
    with no tensor entry built; None for anything else."""
    manifest = metadata.manifest
    if not isinstance(manifest, ColumnarManifest) or rank >= metadata.world_size:
        return None
    c = manifest.tensor_columns()  # checks the containers first, as iterating the manifest does
    kinds = c.kind.tolist()

    def segment(r: int) -> list[int]:  # the indices of rank r's entries, in the writer's order
        low, high = (int(x) for x in np.searchsorted(c.rank, [r, r + 1]))
        indices: list[int] = (low + np.argsort(c.order[low:high], kind="stable")).tolist()
        return indices

    paths = c.paths
    slots: dict[str, Entry | int] = {}
    for i in segment(rank):
        slots[paths[i]] = c.entry(i) if kinds[i] == KIND_ROW else i
    if rank != 0:
        replicated = c.replicated.tolist()
        for i in segment(0):
            if paths[i] not in slots:
                if kinds[i] != KIND_ROW:
                    if replicated[i]:
                        slots[paths[i]] = i
                elif is_shared(entry := c.entry(i)):
                    slots[paths[i]] = entry
    return ColumnView(c, slots)


def plan_column_leaves(
    leaves: ColumnView,
    destinations: Mapping[str, Any],
    loader: LeafLoader,
    plan_leaf: Callable[[str, Entry, Any], None],
) -> dict[str, Any]:
    """Plan the leaves of ``leaves``: a plain one-piece raw tensor whose destination is a plain,
    non-empty, contiguous CPU tensor of its dtype and shape is read straight into it
    (:meth:`~.place.LeafLoader.add_piece_in_place`); every other leaf is built and handed to
    ``plan_leaf(path, entry, destination)``.

    Returns the destinations filled in place.
    """
    c, lists = leaves.columns, leaves.lists
    kinds, dtypes, dtype_of, lengths = lists.kind, c.dtypes, lists.dtype, lists.length
    piece_offsets, dim_offsets, dims = lists.piece_offsets, lists.dim_offsets, lists.dims
    known: dict[str, Any] = {}
    add_piece_in_place, piece, entry = loader.add_piece_in_place, lists.piece, c.entry
    for path, slot in leaves.slots.items():
        destination = destinations.get(path)
        if type(slot) is not int:
            plan_leaf(path, slot, destination)  # type: ignore[arg-type]
            continue
        first = piece_offsets[slot]
        if (
            (type(destination) is torch.Tensor or type(destination) is torch.nn.Parameter)
            and kinds[slot] == KIND_RAW
            and piece_offsets[slot + 1] - first == 1
            and dtype_name_of(destination.dtype) == dtypes[dtype_of[slot]]
            and destination.layout == torch.strided
            and destination.is_cpu
            and destination.nbytes == lengths[first]
            and lengths[first]
            and destination.shape == tuple(dims[dim_offsets[slot] : dim_offsets[slot + 1]])
            and destination.is_contiguous()
            and not destination.is_conj()
            and not destination.is_neg()
            and not destination.is_quantized
            and add_piece_in_place(path, piece(first), destination)
        ):
            known[path] = destination
            continue
        plan_leaf(path, entry(slot), destination)
    return known
