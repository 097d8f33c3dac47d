"""A version-5 manifest's tensor entries as columns: planning a restore without an object per entry.

:meth:`~snapshotkit._format.columnar.ColumnarManifest.tensor_columns` returns them; the restore's
in-place fast path (:mod:`snapshotkit._restore.columns`) plans plain one-piece tensors from them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np

from snapshotkit._format.entries import DictEntry, Entry, ListEntry, child_paths, is_shared
from snapshotkit._format.pieces import _fail
from snapshotkit.errors import ManifestError


@dataclasses.dataclass(frozen=True)
class TensorColumns:
    """The tensor entries of a version-5 manifest as columns, for planning without an object per entry.

    Per entry ``i`` (index into ``paths``, keys ``f"{rank[i]}/{paths[i]}"``): ``kind`` (0: a row,
    see :meth:`ColumnarManifest.row_or_tensor`), ``replicated``, ``dtype`` (index into ``dtypes``),
    its shape ``dims[dim_offsets[i]:dim_offsets[i + 1]]`` and its pieces ``piece_offsets[i]`` to
    ``piece_offsets[i + 1]``. Per piece ``j``: ``location`` (index into ``locations``), ``start``,
    ``length``, ``checksum`` (CRC-32C), ``base`` (index into ``bases``, whose first is None: this
    snapshot) and its 16 bytes of ``hashes`` (XXH3-128). ``entry(i)`` builds entry ``i`` as the
    mapping would. Every column was checked on decoding.
    """

    paths: list[str]
    rank: np.ndarray
    order: np.ndarray
    kind: np.ndarray
    replicated: np.ndarray
    dtype: np.ndarray
    dtypes: list[str]
    dims: np.ndarray
    dim_offsets: np.ndarray
    piece_offsets: np.ndarray
    location: np.ndarray
    start: np.ndarray
    length: np.ndarray
    checksum: np.ndarray
    base: np.ndarray
    hashes: bytes
    locations: list[str]
    bases: list[str | None]
    entry: Callable[[int], Entry]


def check_column_containers(
    paths: list[str], rank: np.ndarray, kind: np.ndarray, replicated: np.ndarray, rows: list[Entry]
) -> None:
    """:func:`~snapshotkit._format.entries.check_containers` over columns (kind 0: the next of
    ``rows``), with no key built per entry: each rank's paths as one set, the containers' children
    looked up in it, and the same checks in the same order, so the same first error.

    Raises:
        ManifestError: as :func:`~snapshotkit._format.entries.check_containers`.
    """
    count = len(paths)
    ranks = rank.tolist()
    bounds = [0, *(np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist(), count]
    held = {ranks[low]: set(paths[low:high]) for low, high in itertools.pairwise(bounds) if high > low}
    row_at = np.flatnonzero(kind == 0).tolist()
    zero = held.get(0, set())
    rank_zero = bounds[1] if count and ranks[0] == 0 else 0
    shared = set(map(paths.__getitem__, np.flatnonzero(replicated[:rank_zero]).tolist()))
    shared.update(paths[i] for i, row in zip(row_at, rows, strict=True) if ranks[i] == 0 and is_shared(row))
    reached: dict[int, set[str]] = {r: set() for r in held}
    for i, row in zip(row_at, rows, strict=True):
        if isinstance(row, DictEntry):
            children = child_paths(paths[i], row.keys)
        elif isinstance(row, ListEntry):
            if row.length > count:  # each child needs an entry: refuse before building names
                raise _fail(
                    f"{ranks[i]}/{paths[i]}", f"length {row.length} exceeds the {count} entries of the manifest"
                )
            children = child_paths(paths[i], range(row.length))
        else:
            continue
        key = f"{ranks[i]}/{paths[i]}"
        if len(set(children)) != len(children):
            raise ManifestError(f"malformed manifest entry {key!r}: two keys name the same child")
        own, mine = held[ranks[i]], reached[ranks[i]]
        for child in itertools.filterfalse(own.__contains__, children):
            if child in shared and child in zero:
                reached[0].add(child)
                continue
            raise ManifestError(
                f"malformed manifest entry {key!r}: it names child {f'{ranks[i]}/{child}'!r}, which has no entry; "
                "the manifest is corrupt"
            )
        mine.update(children)
    for low, high in itertools.pairwise(bounds):
        if high > low:
            r = ranks[low]
            unreached = [path for path in held[r].difference(reached[r]) if "/" in path]
            if unreached:  # a rank's paths are sorted: the first in key order is the least
                raise _fail(f"{r}/{min(unreached)}", "no container names this entry; the manifest is corrupt")
