"""Format version 5's ``entries`` member, written: the writer's side of
:mod:`snapshotkit._format.columnar` (``docs/format.md`` section 11).

:func:`encode_entries` puts every tensor entry whose pieces all have a content hash into the
columns and every other entry into ``rows``, column by column (a pass per column over lists,
numpy for the arithmetic and the hex digits), not entry by entry: a take of many small tensors
writes an entry and a piece per tensor.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from snapshotkit._format.columnar import (
    _CHECKSUM_PREFIX,
    _HASH_BYTES,
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

    Built column by column (a pass per column over lists, numpy for the arithmetic), not entry by
    entry: a take of many small tensors writes an entry and a piece per tensor.

    Raises:
        ValueError: a key is not ``"<rank>/<logical path>"``.
    """
    ranks: dict[str, int] = {}  # rank text -> rank, each text checked once
    order: list[tuple[int, str, int, Entry]] = []
    for position, (key, entry) in enumerate(manifest.items()):
        text, slash, path = key.partition("/")
        rank = ranks.get(text)
        if rank is None:
            if not slash or _RANK_TEXT.fullmatch(text) is None:
                raise ValueError(f"manifest key {key!r} is not '<rank>/<logical path>'")
            rank = ranks[text] = int(text)
        order.append((rank, path, position, entry))
    order.sort()  # by rank, then path: (rank, path) is unique, so the entries are never compared
    count = len(order)
    # Entries in the columns: tensors whose pieces all have a content hash; the others are rows.
    columnar: list[int] = []
    tensors: list[TensorEntry] = []
    rows: list[dict[str, Any]] = []
    for at, item in enumerate(order):
        entry = item[3]
        if type(entry) is TensorEntry or isinstance(entry, TensorEntry):
            pieces = entry.pieces
            if (len(pieces) == 1 and pieces[0].hash is not None) or all(p.hash is not None for p in pieces):
                columnar.append(at)
                tensors.append(entry)
                continue
        rows.append(entry.to_json())
    entry_cols = {name: np.zeros(count, dtype=dtype) for name, dtype in ENTRY_COLUMNS.items()}
    entry_cols["order"][:] = [item[2] for item in order]
    entry_cols["rank"][:] = [item[0] for item in order]
    where = np.asarray(columnar, dtype=np.int64)
    entry_cols["kind"][where] = [KIND_RAW if entry.serializer == "raw" else KIND_TORCH_SAVE for entry in tensors]
    entry_cols["replicated"][where] = [entry.replicated for entry in tensors]
    dtypes: dict[str, int] = {}
    entry_cols["dtype"][where] = [dtypes.setdefault(entry.dtype, len(dtypes)) for entry in tensors]
    shapes = [entry.shape for entry in tensors]
    entry_cols["ndim"][where] = list(map(len, shapes))
    all_pieces = [entry.pieces for entry in tensors]
    entry_cols["piece_count"][where] = list(map(len, all_pieces))
    dims = list(itertools.chain.from_iterable(shapes))
    held = list(itertools.chain.from_iterable(all_pieces))
    locations: dict[str, int] = {}
    bases: dict[str, int] = {}
    ranges = np.array([piece.byte_range for piece in held], dtype=np.int64).reshape(-1, 2)
    piece_cols = {
        "location": [locations.setdefault(piece.location, len(locations)) for piece in held],
        "start": ranges[:, 0],
        "length": ranges[:, 1] - ranges[:, 0],
        "checksum": _checksums([piece.checksum for piece in held]),
        "base": [0 if (base := piece.base) is None else bases.setdefault(base, len(bases)) + 1 for piece in held],
    }
    out: dict[str, Any] = {"paths": [item[1] for item in order]}
    out.update({name: _b64(entry_cols[name], dtype) for name, dtype in ENTRY_COLUMNS.items()})
    out["dims"] = _b64(dims, "<i8")
    out["dtypes"] = list(dtypes)
    out["locations"] = list(locations)
    out["bases"] = list(bases)
    out.update({name: _b64(piece_cols[name], dtype) for name, dtype in PIECE_COLUMNS.items()})
    out["hash"] = base64.b64encode(_hashes([str(piece.hash) for piece in held])).decode("ascii")
    out["rows"] = rows
    return out


def _checksums(texts: list[str]) -> Any:
    """The CRC-32C values of ``"crc32c:<hex>"`` texts: in one ``bytes.fromhex`` when every text
    has eight hex digits (what :func:`~snapshotkit._format.checksum.format_checksum` writes)."""
    digits = _hex_digits(texts, _CHECKSUM_PREFIX, 8)
    if digits is not None:
        return np.frombuffer(bytes.fromhex(digits), dtype=">u4")
    return [int(text.removeprefix(_CHECKSUM_PREFIX), 16) for text in texts]


def _hashes(texts: list[str]) -> bytes:
    """The 16-byte digests of ``"xxh3-128:<32 hex digits>"`` texts, back to back."""
    digits = _hex_digits(texts, _HASH_PREFIX, 2 * _HASH_BYTES)
    if digits is not None:
        return bytes.fromhex(digits)
    return b"".join([bytes.fromhex(text.removeprefix(_HASH_PREFIX)) for text in texts])


def _hex_digits(texts: list[str], prefix: str, width: int) -> str | None:
    """The digits of every text, back to back, when each text is ``prefix`` and ``width`` more
    ASCII characters (checked over all of them at once with numpy); else None."""
    if not texts:
        return ""
    if set(map(len, texts)) != {len(prefix) + width}:
        return None
    try:
        joined = "".join(texts).encode("ascii")
    except UnicodeEncodeError:
        return None
    table = np.frombuffer(joined, dtype=np.uint8).reshape(len(texts), len(prefix) + width)
    if not (table[:, : len(prefix)] == np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)).all():
        return None
    return table[:, len(prefix) :].tobytes().decode("ascii")
