"""The encoder of format version 5's ``entries`` member before the first-take work of issue 27
(entry by entry), kept verbatim as the reference the column-by-column
:func:`snapshotkit._format.columnar_encode.encode_entries` is compared with
(``tests/format/test_columnar_encode.py``). Only this docstring and the imports differ."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from snapshotkit._format.columnar import (
    _CHECKSUM_PREFIX,
    _HASH_PREFIX,
    ENTRY_COLUMNS,
    KIND_RAW,
    KIND_TORCH_SAVE,
    PIECE_COLUMNS,
)
from snapshotkit._format.entries import _RANK_TEXT, Entry, TensorEntry


def _b64(values: Any, dtype: str) -> str:
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def encode_entries(manifest: Mapping[str, Entry]) -> dict[str, Any]:
    """The ``entries`` member for ``manifest`` (keys ``"<rank>/<logical path>"``): JSON-ready.

    Raises:
        ValueError: a key is not ``"<rank>/<logical path>"``.
    """
    order: list[tuple[int, str, int, Entry]] = []
    for position, (key, entry) in enumerate(manifest.items()):
        rank, slash, path = key.partition("/")
        if not slash or _RANK_TEXT.fullmatch(rank) is None:
            raise ValueError(f"manifest key {key!r} is not '<rank>/<logical path>'")
        order.append((int(rank), path, position, entry))
    order.sort(key=lambda item: (item[0], item[1]))
    dtypes: dict[str, int] = {}
    locations: dict[str, int] = {}
    bases: dict[str, int] = {}
    entry_cols: dict[str, list[int]] = {name: [] for name in ENTRY_COLUMNS}
    piece_cols: dict[str, list[int]] = {name: [] for name in PIECE_COLUMNS}
    dims: list[int] = []
    hashes: list[bytes] = []
    rows: list[dict[str, Any]] = []
    for rank_index, _, position, entry in order:
        entry_cols["order"].append(position)
        entry_cols["rank"].append(rank_index)
        if not isinstance(entry, TensorEntry) or any(piece.hash is None for piece in entry.pieces):
            rows.append(entry.to_json())
            for name in ("kind", "replicated", "dtype", "ndim", "piece_count"):
                entry_cols[name].append(0)
            continue
        entry_cols["kind"].append(KIND_RAW if entry.serializer == "raw" else KIND_TORCH_SAVE)
        entry_cols["replicated"].append(int(entry.replicated))
        entry_cols["dtype"].append(dtypes.setdefault(entry.dtype, len(dtypes)))
        entry_cols["ndim"].append(len(entry.shape))
        entry_cols["piece_count"].append(len(entry.pieces))
        dims.extend(entry.shape)
        for piece in entry.pieces:
            start, end = piece.byte_range
            piece_cols["location"].append(locations.setdefault(piece.location, len(locations)))
            piece_cols["start"].append(start)
            piece_cols["length"].append(end - start)
            piece_cols["checksum"].append(int(piece.checksum.removeprefix(_CHECKSUM_PREFIX), 16))
            piece_cols["base"].append(0 if piece.base is None else bases.setdefault(piece.base, len(bases)) + 1)
            hashes.append(bytes.fromhex(str(piece.hash).removeprefix(_HASH_PREFIX)))
    out: dict[str, Any] = {"paths": [path for _, path, _, _ in order]}
    out.update({name: _b64(entry_cols[name], dtype) for name, dtype in ENTRY_COLUMNS.items()})
    out["dims"] = _b64(dims, "<i8")
    out["dtypes"] = list(dtypes)
    out["locations"] = list(locations)
    out["bases"] = list(bases)
    out.update({name: _b64(piece_cols[name], dtype) for name, dtype in PIECE_COLUMNS.items()})
    out["hash"] = base64.b64encode(b"".join(hashes)).decode("ascii")
    out["rows"] = rows
    return out
