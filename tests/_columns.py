"""A version-5 manifest's ``entries`` member read and written from docs/format.md section 11 alone
(not through snapshotkit's decoder): the tests' second opinion, and their way to edit columns."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

#: docs/format.md 11.2 and 11.3: each column's little-endian type, and what it is counted by.
ENTRY_COLUMNS = {
    "order": "<u4",
    "rank": "<u4",
    "kind": "u1",
    "replicated": "u1",
    "dtype": "<u2",
    "ndim": "<u4",
    "piece_count": "<u4",
}
PIECE_COLUMNS = {"location": "<u4", "start": "<i8", "length": "<i8", "checksum": "<u4", "base": "<u4"}


def read_columns(entries: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every numeric column as a (writable) numpy array; ``hash`` as an ``(pieces, 16)`` uint8 array."""
    out = {}
    for name, dtype in {**ENTRY_COLUMNS, **PIECE_COLUMNS, "dims": "<i8", "hash": "u1"}.items():
        out[name] = np.frombuffer(base64.b64decode(entries[name]), dtype=dtype).copy()
    out["hash"] = out["hash"].reshape(-1, 16)
    return out


def write_columns(entries: dict[str, Any], **columns: Any) -> dict[str, Any]:
    """``entries`` with the given columns replaced (each encoded in its column's type)."""
    out = dict(entries)
    types = {**ENTRY_COLUMNS, **PIECE_COLUMNS, "dims": "<i8", "hash": "u1"}
    for name, values in columns.items():
        out[name] = base64.b64encode(np.asarray(values).astype(types[name]).tobytes()).decode("ascii")
    return out


def as_json_entries(entries: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The version-4 JSON form (``"<rank>/<path>"`` -> entry) of every entry, by the format text, in
    the writer's order (the ``order`` column)."""
    c = read_columns(entries)
    dim_at = [0, *np.cumsum(c["ndim"], dtype=np.int64).tolist()]
    piece_at = [0, *np.cumsum(c["piece_count"], dtype=np.int64).tolist()]
    rows = iter(entries["rows"])
    out: dict[str, dict[str, Any]] = {}
    for i, path in enumerate(entries["paths"]):
        key = f"{int(c['rank'][i])}/{path}"
        kind = int(c["kind"][i])
        if kind == 0:
            out[key] = next(rows)
            continue
        pieces = []
        for j in range(piece_at[i], piece_at[i + 1]):
            start, length = int(c["start"][j]), int(c["length"][j])
            piece = {
                "location": entries["locations"][int(c["location"][j])],
                "byte_range": [start, start + length],
                "checksum": f"crc32c:{int(c['checksum'][j]):08x}",
                "hash": "xxh3-128:" + bytes(c["hash"][j]).hex(),
            }
            if int(c["base"][j]):
                piece["base"] = entries["bases"][int(c["base"][j]) - 1]
            pieces.append(piece)
        out[key] = {
            "kind": "tensor",
            "dtype": entries["dtypes"][int(c["dtype"][i])],
            "shape": [int(d) for d in c["dims"][dim_at[i] : dim_at[i + 1]]],
            "serializer": "raw" if kind == 1 else "torch_save",
            "replicated": bool(c["replicated"][i]),
            "pieces": pieces,
        }
    keys = list(out)
    return {keys[i]: out[keys[i]] for i in np.argsort(c["order"]).tolist()}
