"""A version-5 manifest's tensor entries as columns: planning a restore without an object per entry.

:meth:`~snapshotkit._format.columnar.ColumnarManifest.tensor_columns` returns them; the restore's
in-place fast path (:mod:`snapshotkit._restore.columns`) plans plain one-piece tensors from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from snapshotkit._format.entries import Entry, TensorEntry, check_containers

#: Container checks read only an entry's kind and replicated flag: these stand in for the tensors.
_STAND_INS = (TensorEntry("uint8", (0,), "raw", ()), TensorEntry("uint8", (0,), "raw", (), True))


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
    ``rows``), with no tensor entry built.

    Raises:
        ManifestError: as :func:`~snapshotkit._format.entries.check_containers`.
    """
    next_row = iter(rows).__next__
    flags, kinds, ranks = replicated.tolist(), kind.tolist(), rank.tolist()
    check_containers(
        {f"{ranks[i]}/{path}": next_row() if kinds[i] == 0 else _STAND_INS[flags[i]] for i, path in enumerate(paths)}
    )
