"""A rank's view of a version-5 manifest in which tensors stay column indices until needed.

:func:`rank_view` of :mod:`.plan` builds an entry object per logical path. For a version-5
manifest (:class:`~snapshotkit._format.columnar.ColumnarManifest`), :func:`column_rank_view`
gives the same view as a :class:`ColumnView`: containers and the other rows as entries, tensors
as their index into :class:`~snapshotkit._format.tensor_columns.TensorColumns`. Planning a
restore (:func:`plan_column_leaves`) fills plain contiguous CPU destinations from one raw piece
straight from the columns; every other tensor is built and planned as before.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from snapshotkit._format.columnar import KIND_RAW, KIND_ROW, ColumnarManifest, make_piece
from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import DictEntry, Entry, ListEntry, Piece, is_shared
from snapshotkit._format.tensor_columns import TensorColumns
from snapshotkit._restore.fits import DTYPE_NAMES
from snapshotkit._restore.place import LeafLoader
from snapshotkit._restore.runs import InPlaceRun


class _Lists:
    """The columns planning reads per entry, as Python lists (each converted once, when first read)."""

    def __init__(self, c: TensorColumns) -> None:
        self._columns: TensorColumns = c
        self._simple: np.ndarray | None = None
        self.locations, self.bases = c.locations, c.bases

    @functools.cached_property
    def replicated(self) -> list[int]:
        return self._columns.replicated.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def piece_offsets(self) -> list[int]:
        return self._columns.piece_offsets.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def _pieces(self) -> tuple[list[int], list[int], list[int], list[int], list[int], str]:
        c = self._columns
        columns = (c.location, c.start, c.length, c.checksum, c.base)
        location, start, length, checksum, base = (column.tolist() for column in columns)
        return location, start, length, checksum, base, c.hashes.hex()

    def simple(self) -> np.ndarray:
        """Per entry: whether it is a raw tensor of one non-empty piece of this snapshot (not of a base)."""
        if self._simple is None:
            c = self._columns
            one = c.piece_offsets[1:] - c.piece_offsets[:-1] == 1
            first = np.minimum(c.piece_offsets[:-1], max(len(c.length) - 1, 0))
            if len(c.length):
                one &= (c.base[first] == 0) & (c.length[first] > 0)
            self._simple = (c.kind == KIND_RAW) & one
        simple: np.ndarray = self._simple
        return simple

    def piece(self, j: int) -> Piece:
        """Piece ``j``, as the manifest's entry holds it."""
        location, start, length, checksum, base, hexes = self._pieces
        digest = hexes[32 * j : 32 * j + 32]
        return make_piece(self.locations[location[j]], start[j], length[j], checksum[j], digest, self.bases[base[j]])


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
        below = root + "/"
        paths = list(self.slots)
        within = list(map(str.startswith, paths, itertools.repeat(below)))
        if root in self.slots:
            within[paths.index(root)] = True
        inside = list(itertools.compress(paths, within))
        if len(inside) == len(self.slots):  # one app_state key: everything (a dict copy runs in C)
            leaves = dict(self.slots)
        else:
            slots = self.slots
            leaves = dict(zip(inside, map(slots.__getitem__, inside), strict=True))
        containers: dict[str, DictEntry | ListEntry] = {}
        for path in list(
            itertools.compress(leaves, map(operator.is_not, map(type, leaves.values()), itertools.repeat(int)))
        ):
            slot = leaves[path]
            if isinstance(slot, (DictEntry, ListEntry)):
                containers[path] = slot
                del leaves[path]
        return containers, ColumnView(self.columns, leaves, self.lists)


def column_rank_view(metadata: SnapshotMetadata, rank: int) -> ColumnView | None:
    """:func:`~.plan.rank_view` for a version-5 manifest and a rank that took part in the take,
    with no tensor entry built; None for anything else."""
    manifest = metadata.manifest
    if not isinstance(manifest, ColumnarManifest) or rank >= metadata.world_size:
        return None
    c = manifest.tensor_columns()  # checks the containers first, as iterating the manifest does

    def segment(r: int) -> np.ndarray:  # the indices of rank r's entries, in the writer's order
        low, high = (int(x) for x in np.searchsorted(c.rank, [r, r + 1]))
        return low + np.argsort(c.order[low:high], kind="stable")

    paths = c.paths
    own = segment(rank)
    indices = own.tolist()
    slots: dict[str, Entry | int] = dict(zip(map(paths.__getitem__, indices), indices, strict=True))
    for i in own[c.kind[own] == KIND_ROW].tolist():  # rows keep their place in the writer's order
        slots[paths[i]] = c.entry(i)
    if rank != 0:
        kinds, replicated = c.kind.tolist(), c.replicated.tolist()
        for i in segment(0).tolist():
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
    """Plan the leaves of ``leaves``: a plain one-piece raw tensor of this snapshot whose
    destination is a plain, non-empty, contiguous CPU tensor of its dtype and shape is read
    straight into it, all of them as one :class:`~.runs.InPlaceRun` (or, when the loader takes
    no runs, by :meth:`~.place.LeafLoader.add_piece_in_place` each); every other leaf is built
    and handed to ``plan_leaf(path, entry, destination)``, after the run was planned.

    Returns the destinations filled in place.
    """
    all_paths, values = list(leaves.slots), list(leaves.slots.values())
    n = len(all_paths)
    targets_all = list(map(destinations.get, all_paths))
    # candidates: a column index, a plain tensor destination, a raw one-piece entry of this snapshot
    candidate = np.fromiter(map(operator.is_, map(type, values), itertools.repeat(int)), dtype=bool, count=n)
    candidate &= np.fromiter(map(_PLAIN.__contains__, map(type, targets_all)), dtype=bool, count=n)
    positions = np.flatnonzero(candidate)
    picked = positions.tolist()
    slots = np.fromiter(map(values.__getitem__, picked), dtype=np.int64, count=len(picked))
    simple = leaves.lists.simple()[slots]
    positions, slots = positions[simple], slots[simple]
    targets: list[torch.Tensor]  # each a plain tensor (the candidates' destinations)
    if len(positions) == n:  # the common case: every leaf (no copies)
        paths, targets = all_paths, targets_all  # type: ignore[assignment]
    else:
        picked = positions.tolist()
        paths, targets = list(map(all_paths.__getitem__, picked)), [targets_all[k] for k in picked]
    fits = _fits(leaves.columns, slots, targets)
    known: dict[str, Any] = {}
    if fits.any():
        known = _plan_fitting(leaves, loader, fits, paths, slots, targets)
    candidate[:] = False
    candidate[positions[fits]] = True
    entry = leaves.columns.entry
    for k in np.flatnonzero(~candidate).tolist():  # the rest go the general way, in the order of the leaves
        slot = values[k]
        plan_leaf(all_paths[k], entry(slot) if type(slot) is int else slot, targets_all[k])  # type: ignore[arg-type]
    return known


_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))


def _fits(c: TensorColumns, slots: np.ndarray, targets: list[torch.Tensor]) -> np.ndarray:
    """Per candidate: whether its destination is a plain contiguous CPU tensor of the entry's
    dtype and shape, without a lazy conj/neg bit, checked column by column (a quantized
    tensor's dtype is never a raw dtype, so the dtype check refuses it; :func:`_plain_memory`
    checks the memory)."""
    n = len(targets)
    if not n:
        return np.zeros(0, dtype=bool)

    def column(values: Iterator[Any], dtype: Any = bool) -> np.ndarray:
        return np.fromiter(values, dtype=dtype, count=n)

    dtypes = list(map(_DTYPE, targets))
    fits = _plain_memory(targets, any(dtype.is_complex for dtype in set(dtypes)))
    code_of = _Codes({dtype: c.dtypes.index(name) for dtype, name in DTYPE_NAMES.items() if name in c.dtypes})
    if dtypes.count(dtypes[0]) == n:  # the common case: one dtype (counted in C, by identity first)
        fits &= c.dtype[slots] == code_of[dtypes[0]]
    else:
        fits &= column(map(code_of.__getitem__, dtypes), np.int64) == c.dtype[slots]
    # dtype and shape decide the bytes: decoding checked that the piece holds the shape's bytes
    shapes = list(map(_SHAPE, targets))
    ndim = column(map(len, shapes), np.int64)
    low = c.dim_offsets[slots]
    fits &= ndim == c.dim_offsets[slots + 1] - low
    same = fits.nonzero()[0]
    kept = shapes if len(same) == n else list(map(shapes.__getitem__, same.tolist()))
    sizes = np.fromiter(itertools.chain.from_iterable(kept), np.int64)
    counts = ndim[same]
    # the saved dims of the candidates whose ndim matches, in the same order as ``sizes``
    firsts = np.repeat(low[same] - np.cumsum(counts) + counts, counts) + np.arange(len(sizes))
    differs = np.bincount(np.repeat(np.arange(len(same)), counts), weights=sizes != c.dims[firsts], minlength=len(same))
    fits[same[differs > 0]] = False
    return fits


def _plain_memory(targets: list[torch.Tensor], complex_dtypes: bool) -> np.ndarray:
    """Per tensor: whether it is a strided CPU tensor, contiguous, without a lazy conj or neg bit,
    not an inference tensor.

    Each property is read for every tensor, one pass per property (one attribute per pass: a
    getter of several attributes costs more); when every tensor has them all (the common case)
    the passes are ``all``/``any`` in C and no column is built, otherwise every property of
    every tensor is read again as a column. The conj bit is read only when ``complex_dtypes``
    (some tensor is complex): torch sets it on complex tensors alone.
    """
    n, tensor, strided = len(targets), torch.Tensor, itertools.repeat(torch.strided)
    if (
        all(map(operator.is_, map(_LAYOUT, targets), strided))
        and all(map(_IS_CPU, targets))
        and all(map(tensor.is_contiguous, targets))
        and not (complex_dtypes and any(map(tensor.is_conj, targets)))
        and not any(map(tensor.is_neg, targets))
        and not any(map(tensor.is_inference, targets))  # refused by plan.check_destination
    ):
        return np.ones(n, dtype=bool)

    def column(values: Iterator[Any]) -> np.ndarray:
        return np.fromiter(values, dtype=bool, count=n)

    fits = column(map(operator.is_, map(_LAYOUT, targets), itertools.repeat(torch.strided)))
    fits &= column(map(_IS_CPU, targets))
    # the memory properties of strided CPU tensors only: a sparse one has no is_contiguous
    for k in np.flatnonzero(fits).tolist():
        t = targets[k]
        fits[k] = t.is_contiguous() and not (complex_dtypes and t.is_conj()) and not t.is_neg() and not t.is_inference()
    return fits


_LAYOUT, _IS_CPU, _DTYPE = operator.attrgetter("layout"), operator.attrgetter("is_cpu"), operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")


class _Codes(dict[torch.dtype, int]):
    """torch dtype -> index in the manifest's dtype table; -1 for one it does not hold."""

    def __missing__(self, key: torch.dtype) -> int:
        return -1


def _plan_fitting(
    leaves: ColumnView,
    loader: LeafLoader,
    fits: np.ndarray,
    paths: list[str],
    slots: np.ndarray,
    targets: list[torch.Tensor],
) -> dict[str, Any]:
    """Plan the candidates that ``fits``; those that cannot be read in place with the rest (their
    memory is another's) are set false in ``fits``. Returns the destinations planned."""
    c, lists = leaves.columns, leaves.lists
    if not loader.takes_runs:
        for k in np.flatnonzero(fits).tolist():
            first = lists.piece_offsets[int(slots[k])]
            if not loader.add_piece_in_place(paths[k], lists.piece(first), targets[k]):
                fits[k] = False
        return {paths[k]: targets[k] for k in np.flatnonzero(fits).tolist()}
    if fits.all():  # the common case
        addresses = np.fromiter(map(torch.Tensor.data_ptr, targets), dtype=np.int64, count=len(targets))
    else:  # only the fitting ones: a sparse tensor has no data pointer
        addresses = np.zeros(len(targets), dtype=np.int64)
        for k in np.flatnonzero(fits).tolist():
            addresses[k] = targets[k].data_ptr()
    taken, counts = np.unique(addresses[fits], return_counts=True)
    shared = taken[counts > 1]  # tied destinations: add() reads the first and compares the others
    earlier = loader.in_place_addresses()
    if len(shared) or earlier:
        fits &= ~np.isin(addresses, np.array([*shared.tolist(), *earlier], dtype=np.int64))
    chosen = np.flatnonzero(fits)
    if not len(chosen):
        return {}
    first = c.piece_offsets[slots[chosen]]
    if len(chosen) == len(paths):  # the common case: every candidate
        run_paths, run_targets = paths, targets
    else:
        chosen_list = chosen.tolist()
        run_paths, run_targets = list(map(paths.__getitem__, chosen_list)), list(map(targets.__getitem__, chosen_list))
    loader.add_run(
        InPlaceRun(
            run_paths,
            run_targets,
            addresses[chosen],
            c.location[first],
            c.start[first],
            c.length[first],
            c.checksum[first],
            c.locations,
            lambda i: lists.piece(int(first[i])),
        )
    )
    return dict(zip(run_paths, run_targets, strict=True))
