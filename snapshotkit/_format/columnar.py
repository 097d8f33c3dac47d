"""Format version 5: the manifest's entries as columns, decoded without an object per entry.

A version-5 manifest holds its entries in one header member ``entries`` (``docs/format.md``
section 11): the logical paths as one sorted string table, per-entry columns (rank, kind,
replicated, dtype index, shape, piece count) and per-piece columns (data object index, start,
length, CRC-32C, content hash, base index), each a base64 string of little-endian integers, plus
version-4 style JSON ``rows`` for the entries that are not plain tensors (containers, primitives,
objects, sharded tensors). :func:`decode_entries` checks every column at once with numpy (lengths,
indices in range, sizes within the limits, byte counts against dtypes and shapes) and returns a
:class:`ColumnarManifest`: a read-only mapping that builds an entry only when asked for it, and
finds one by bisection, so reading one logical path never builds the others.

The writer's side is :func:`snapshotkit._format.columnar_encode.encode_entries`: it puts every
tensor entry whose pieces all have a content hash into the columns and every other entry into ``rows``.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from snapshotkit._format.dtypes import DTYPE_NAME, MAX_NUMEL, RAW_ITEMSIZE
from snapshotkit._format.entries import _RANK_TEXT, Entry, TensorEntry, check_containers, decode_entry
from snapshotkit._format.pieces import Piece, _fail, validate_base_location, validate_location
from snapshotkit._format.tensor_columns import TensorColumns, check_column_containers
from snapshotkit.errors import ManifestError, UnsafeLocationError

#: The first format version with columnar entries.
COLUMNAR_SINCE = 5
#: The header member that holds them.
ENTRIES_MEMBER = "entries"
#: Entry kinds of the ``kind`` column.
KIND_ROW, KIND_RAW, KIND_TORCH_SAVE = 0, 1, 2
#: Byte offsets and lengths of pieces are below this (4 EiB), and so is the sum of all lengths:
#: sums and ends then fit a signed 64-bit integer without overflow.
MAX_PIECE_BYTES = 2**62
#: Per-entry columns: name -> little-endian numpy dtype.
ENTRY_COLUMNS = {
    "order": "<u4",
    "rank": "<u4",
    "kind": "u1",
    "replicated": "u1",
    "dtype": "<u2",
    "ndim": "<u4",
    "piece_count": "<u4",
}
#: Per-piece columns (``hash`` apart: 16 bytes per piece, the XXH3-128 digest big-endian).
PIECE_COLUMNS = {"location": "<u4", "start": "<i8", "length": "<i8", "checksum": "<u4", "base": "<u4"}
_HASH_BYTES = 16
_HASH_PREFIX = "xxh3-128:"
_CHECKSUM_PREFIX = "crc32c:"


def _where(name: str) -> str:
    return f"the {ENTRIES_MEMBER!r} member {name!r}"


def _raw_column(raw: Mapping[str, Any], name: str, nbytes: int) -> bytes:
    text = raw.get(name)
    if type(text) is not str:
        raise ManifestError(f"{_where(name)} must be a base64 string, got {type(text).__name__}")
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise ManifestError(f"{_where(name)} is not base64; the manifest is corrupt or crafted") from None
    if len(data) != nbytes:
        raise ManifestError(
            f"{_where(name)} holds {len(data)} bytes where {nbytes} are needed; the manifest is corrupt or crafted"
        )
    return data


def _column(raw: Mapping[str, Any], name: str, dtype: str, count: int) -> np.ndarray:
    return np.frombuffer(_raw_column(raw, name, count * np.dtype(dtype).itemsize), dtype=dtype)


def _strings(raw: Mapping[str, Any], name: str) -> list[str]:
    values = raw.get(name)
    if type(values) is not list or not set(map(type, values)) <= {str}:
        raise ManifestError(f"{_where(name)} must be an array of strings")
    return values


def _first(mask: np.ndarray) -> int | None:
    """The index of the first true element, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def decode_entries(
    raw: object, *, world_size: int, bases: Mapping[str, str], check_row: Callable[[str, Entry], None]
) -> ColumnarManifest:
    """Check the ``entries`` member of a version-5 manifest and return it as a lazy mapping.

    ``check_row(key, entry)`` applies the version-4 checks to each decoded row.

    Raises:
        ManifestError: anything malformed (the message names the member or the entry).
    """
    if not isinstance(raw, dict):
        raise ManifestError(f"the header member {ENTRIES_MEMBER!r} must be a JSON object, got {type(raw).__name__}")
    paths = _strings(raw, "paths")
    count = len(paths)
    col = {name: _column(raw, name, dtype, count) for name, dtype in ENTRY_COLUMNS.items()}
    rank, kind = col["rank"], col["kind"]
    dims = _column(raw, "dims", "<i8", int(col["ndim"].sum(dtype=np.uint64)))
    piece_total = int(col["piece_count"].sum(dtype=np.uint64))
    pieces = {name: _column(raw, name, dtype, piece_total) for name, dtype in PIECE_COLUMNS.items()}
    hashes = _raw_column(raw, "hash", piece_total * _HASH_BYTES)
    dtypes, locations, base_names = _strings(raw, "dtypes"), _strings(raw, "locations"), _strings(raw, "bases")
    rows_raw = raw.get("rows")
    if type(rows_raw) is not list:
        raise ManifestError(f"{_where('rows')} must be an array of entries")
    key_of = _key_namer(paths, rank)

    # keys: ranks in range and sorted, paths strictly increasing within a rank (so unique)
    if count and int(rank.max()) >= world_size:
        i = int(np.argmax(rank))
        raise ManifestError(
            f"manifest entry of rank {int(rank[i])} (path {paths[i]!r}) is not < world_size {world_size}"
        )
    bad = _first(rank[1:] < rank[:-1])
    if bad is not None:
        raise ManifestError(f"{_where('rank')} is not sorted at entry {bad + 1}; the manifest is corrupt or crafted")
    bounds = [0, *(np.flatnonzero(rank[1:] != rank[:-1]) + 1).tolist(), count]
    for low, high in itertools.pairwise(bounds):
        segment = paths[low:high]  # sorted and unique: each path below the next, compared pairwise in C
        if not all(map(operator.lt, segment, itertools.islice(segment, 1, None))):
            i = next(i for i in range(low + 1, high) if not paths[i - 1] < paths[i])
            raise _fail(key_of(i), "the paths are not sorted and unique within a rank; the manifest is corrupt")

    # the writer's order: a permutation of the entries
    seen = np.zeros(count, dtype=bool)
    if count and int(col["order"].max()) >= count:
        raise ManifestError(f"{_where('order')} holds {int(col['order'].max())}, not below the {count} entries")
    seen[col["order"]] = True
    if not seen.all():
        raise ManifestError(
            f"{_where('order')} is not a permutation of the entries; the manifest is corrupt or crafted"
        )

    # per-entry columns
    is_row = kind == KIND_ROW
    checks = (
        (kind > KIND_TORCH_SAVE, "its kind code is not 0, 1 or 2"),
        (col["replicated"] > 1, "its replicated flag is not 0 or 1"),
        (is_row & ((col["ndim"] | col["piece_count"] | col["dtype"] | col["replicated"]) != 0), "a row has columns"),
        (~is_row & (col["dtype"] >= len(dtypes)), f"its dtype index is not below {len(dtypes)}"),
        ((kind == KIND_TORCH_SAVE) & (col["piece_count"] != 1), "a torch_save tensor must have exactly one piece"),
    )
    for mask, message in checks:
        bad = _first(mask)
        if bad is not None:
            raise _fail(key_of(bad), message)
    row_count = int(is_row.sum())
    if len(rows_raw) != row_count:
        raise ManifestError(f"{_where('rows')} has {len(rows_raw)} entries where the kind column names {row_count}")
    itemsizes = _dtype_itemsizes(dtypes)
    entry_itemsize = itemsizes[col["dtype"]] if dtypes else np.zeros(count, np.int64)
    bad = _first((kind == KIND_RAW) & (entry_itemsize == 0))
    if bad is not None:
        raise _fail(
            key_of(bad),
            f"dtype {dtypes[int(col['dtype'][bad])]!r} cannot be stored raw (docs/format.md section 4.1 lists the "
            "raw dtypes); the manifest is corrupt or crafted",
        )

    # shapes
    dim_offsets = np.zeros(count + 1, np.int64)
    np.cumsum(col["ndim"], out=dim_offsets[1:])
    bad = _first(dims < 0)
    if bad is not None:
        raise _fail(key_of(int(np.searchsorted(dim_offsets, bad, "right")) - 1), "a shape dimension is negative")
    numel = _numels(dims, dim_offsets, key_of)

    # pieces
    piece_offsets = np.zeros(count + 1, np.int64)
    np.cumsum(col["piece_count"], out=piece_offsets[1:])
    owner = np.repeat(np.arange(count), col["piece_count"].astype(np.int64))
    start, length = pieces["start"], pieces["length"]
    for mask, message in (
        (pieces["location"] >= len(locations), f"a piece's location index is not below {len(locations)}"),
        (pieces["base"] > len(base_names), f"a piece's base index is not at most {len(base_names)}"),
        ((start < 0) | (start >= MAX_PIECE_BYTES), f"a piece's start is not in [0, {MAX_PIECE_BYTES})"),
        ((length < 0) | (length >= MAX_PIECE_BYTES), f"a piece's length is not in [0, {MAX_PIECE_BYTES})"),
    ):
        bad = _first(mask)
        if bad is not None:
            raise _fail(key_of(int(owner[bad])), message)
    if float(length.sum(dtype=np.float64)) >= MAX_PIECE_BYTES:
        raise ManifestError(
            f"the pieces of the manifest hold {MAX_PIECE_BYTES} bytes or more; it is corrupt or crafted"
        )
    ends = np.zeros(piece_total + 1, np.int64)
    np.cumsum(length, out=ends[1:])
    held = ends[piece_offsets[1:]] - ends[piece_offsets[:-1]]
    raw_entry = kind == KIND_RAW
    needed = np.where(numel < 2**58, numel, -1) * entry_itemsize  # never equal to held when numel is that large
    bad = _first(raw_entry & (held != needed))
    if bad is not None:
        need = int(numel[bad]) * int(entry_itemsize[bad])
        raise _fail(
            key_of(bad),
            f"pieces hold {int(held[bad])} bytes but {int(numel[bad])} element(s) of dtype "
            f"{dtypes[int(col['dtype'][bad])]} need {need}",
        )
    unit = np.repeat(np.where(raw_entry, entry_itemsize, 1), col["piece_count"].astype(np.int64))
    bad = _first(length % np.maximum(unit, 1) != 0)
    if bad is not None:
        raise _fail(key_of(int(owner[bad])), f"a piece's length is not a multiple of {int(unit[bad])} bytes")

    # tables
    for index, location in enumerate(locations):
        try:
            validate_location(location)
        except UnsafeLocationError as exc:
            raise UnsafeLocationError(f"{_where('locations')}[{index}]: {exc}") from None
    for base in base_names:
        validate_base_location(base)
        if base not in bases:
            raise ManifestError(f"{_where('bases')} names base {base!r}, which the header's 'bases' does not list")

    row_keys = [key_of(i) for i in np.flatnonzero(is_row).tolist()]
    rows: list[Entry] = []
    for key, row in zip(row_keys, rows_raw, strict=True):
        entry = decode_entry(key, row)
        check_row(key, entry)
        rows.append(entry)
    columns = _Columns(paths, col, dims, dim_offsets, pieces, hashes, piece_offsets, dtypes, locations, base_names)
    return ColumnarManifest(columns, rows, np.cumsum(is_row) - 1)


def _key_namer(paths: list[str], rank: np.ndarray) -> Callable[[int], str]:
    return lambda i: f"{int(rank[i])}/{paths[i]}"


def _dtype_itemsizes(dtypes: list[str]) -> np.ndarray:
    """Bytes per element of each dtype of the table (0 for dtypes that cannot be raw)."""
    for name in dtypes:
        if name not in RAW_ITEMSIZE and DTYPE_NAME.fullmatch(name) is None:
            raise ManifestError(f"{_where('dtypes')} holds {name!r}, which is not a torch dtype name")
    return np.array([RAW_ITEMSIZE.get(name, 0) for name in dtypes], dtype=np.int64)


def _numels(dims: np.ndarray, dim_offsets: np.ndarray, key_of: Callable[[int], str]) -> np.ndarray:
    """Elements of each entry's shape; an extent past :data:`MAX_NUMEL` is refused."""
    count = len(dim_offsets) - 1
    if not count:
        return np.zeros(0, np.int64)
    starts = dim_offsets[:-1]
    segments = starts + np.arange(count)  # each entry's dims, led by a 1 so none is empty
    extent = np.multiply.reduceat(np.insert(np.maximum(dims, 1).astype(np.float64), starts, 1.0), segments)
    for i in np.flatnonzero(extent >= 2.0**61).tolist():  # near the limit: exact integers decide
        exact = math.prod(max(d, 1) for d in dims[dim_offsets[i] : dim_offsets[i + 1]].tolist())
        if exact > MAX_NUMEL:
            shape = dims[dim_offsets[i] : dim_offsets[i + 1]].tolist()
            raise _fail(key_of(i), f"shape {shape} has more elements than torch can index")
    small = extent < 2.0**61
    # exact products where they fit; an entry past that bound multiplies ones (its count is not used)
    safe = np.where(np.repeat(small, np.diff(dim_offsets)), dims, 1)
    numel = np.multiply.reduceat(np.insert(safe, starts, 1), segments)
    return np.where(small, numel, 2**62)


class _Columns:
    """The decoded, checked columns of a version-5 manifest (numpy arrays over the text's bytes)."""

    def __init__(
        self,
        paths: list[str],
        entry: dict[str, np.ndarray],
        dims: np.ndarray,
        dim_offsets: np.ndarray,
        pieces: dict[str, np.ndarray],
        hashes: bytes,
        piece_offsets: np.ndarray,
        dtypes: list[str],
        locations: list[str],
        bases: list[str],
    ) -> None:
        self.paths, self.entry, self.dims, self.dim_offsets = paths, entry, dims, dim_offsets
        self.ranks = entry["rank"].astype(np.int64)  # bisection bounds rank + 1 need not fit 32 bits
        self.pieces, self.hashes, self.piece_offsets = pieces, hashes, piece_offsets
        self.dtypes, self.locations, self.bases = dtypes, locations, [None, *bases]

    def tensor(self, i: int) -> TensorEntry:
        """The tensor entry at index ``i`` (one built from its columns)."""
        first, last = int(self.piece_offsets[i]), int(self.piece_offsets[i + 1])
        p = self.pieces
        hexes = self.hashes[first * _HASH_BYTES : last * _HASH_BYTES].hex()
        pieces = tuple(
            make_piece(self.locations[loc], start, length, checksum, hexes[32 * n : 32 * n + 32], self.bases[base])
            for n, (loc, start, length, checksum, base) in enumerate(
                zip(
                    p["location"][first:last].tolist(),
                    p["start"][first:last].tolist(),
                    p["length"][first:last].tolist(),
                    p["checksum"][first:last].tolist(),
                    p["base"][first:last].tolist(),
                    strict=True,
                )
            )
        )
        e = self.entry
        return TensorEntry(
            self.dtypes[int(e["dtype"][i])],
            tuple(self.dims[self.dim_offsets[i] : self.dim_offsets[i + 1]].tolist()),
            "raw" if int(e["kind"][i]) == KIND_RAW else "torch_save",
            pieces,
            bool(e["replicated"][i]),
        )

    def all_tensors(self) -> Iterator[tuple[int, TensorEntry]]:
        """Every tensor entry, in key order, built with one conversion of each column."""
        e, p = self.entry, self.pieces
        kinds, replicated, dtype = e["kind"].tolist(), e["replicated"].tolist(), e["dtype"].tolist()
        dims, dim_offsets, piece_offsets = self.dims.tolist(), self.dim_offsets.tolist(), self.piece_offsets.tolist()
        locations = [self.locations[i] for i in p["location"].tolist()]
        starts, lengths, bases = p["start"].tolist(), p["length"].tolist(), p["base"].tolist()
        checksums, hexes = p["checksum"].tolist(), self.hashes.hex()
        for i, kind in enumerate(kinds):
            if kind == KIND_ROW:
                continue
            pieces = tuple(
                make_piece(
                    locations[j], starts[j], lengths[j], checksums[j], hexes[32 * j : 32 * j + 32], self.bases[bases[j]]
                )
                for j in range(piece_offsets[i], piece_offsets[i + 1])
            )
            serializer = "raw" if kind == KIND_RAW else "torch_save"
            shape = tuple(dims[dim_offsets[i] : dim_offsets[i + 1]])
            yield i, TensorEntry(self.dtypes[dtype[i]], shape, serializer, pieces, replicated[i] == 1)


def make_piece(location: str, start: int, length: int, checksum: int, digest: str, base: str | None) -> Piece:
    """The piece of one row of the per-piece columns (``digest``: the hash's 32 hex digits)."""
    return Piece(location, (start, start + length), f"{_CHECKSUM_PREFIX}{checksum:08x}", _HASH_PREFIX + digest, base)


class ColumnarManifest(Mapping[str, Entry]):
    """A version-5 manifest as a read-only mapping ``"<rank>/<logical path>"`` -> entry.

    Looking up a key bisects the sorted paths of its rank and builds that one entry. Iterating
    builds every entry once (in the writer's order, the ``order`` column) and checks the containers
    (every child they name has an entry, every entry is reached), as decoding does for versions
    1 to 4; the check runs on the first iteration, not on opening the snapshot, so reading one
    logical path does not pay for it.
    """

    def __init__(self, columns: _Columns, rows: list[Entry], row_index: np.ndarray) -> None:
        self._columns, self._rows, self._row_index = columns, rows, row_index
        self._built: dict[str, Entry] | None = None
        self._containers_checked = False

    def tensor_columns(self) -> TensorColumns:
        """The entries as columns (no object per entry); the containers are checked first, as
        iterating does, so a plan built from the columns sees a manifest iteration would accept."""
        if not self._containers_checked and self._built is None:
            e = self._columns.entry
            check_column_containers(self._columns.paths, e["rank"], e["kind"], e["replicated"], self._rows)
        self._containers_checked = True
        c, p = self._columns, self._columns.pieces
        e = c.entry
        return TensorColumns(
            c.paths, c.ranks, e["order"], e["kind"], e["replicated"], e["dtype"], c.dtypes, c.dims, c.dim_offsets,
            c.piece_offsets, p["location"], p["start"], p["length"], p["checksum"], p["base"], c.hashes,
            c.locations, c.bases, self._entry_at,
        )  # fmt: skip

    def _entry_at(self, i: int) -> Entry:
        if int(self._columns.entry["kind"][i]) == KIND_ROW:
            return self._rows[int(self._row_index[i])]
        return self._columns.tensor(i)

    def _index(self, key: object) -> int:
        if not isinstance(key, str):
            return -1
        rank_text, slash, path = key.partition("/")
        if not slash or _RANK_TEXT.fullmatch(rank_text) is None:
            return -1
        rank, ranks = int(rank_text), self._columns.ranks
        if not len(ranks) or rank > int(ranks[-1]):
            return -1
        low, high = (int(x) for x in np.searchsorted(ranks, [rank, rank + 1]))
        paths = self._columns.paths
        i = bisect.bisect_left(paths, path, low, high)
        return i if i < high and paths[i] == path else -1

    def __getitem__(self, key: str) -> Entry:
        if self._built is not None:
            return self._built[key]
        i = self._index(key)
        if i < 0:
            raise KeyError(key)
        return self._entry_at(i)

    def __contains__(self, key: object) -> bool:
        return self._index(key) >= 0

    def __len__(self) -> int:
        return len(self._columns.paths)

    def __repr__(self) -> str:
        return f"ColumnarManifest(<{len(self)} entries>)"

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def items(self) -> Any:
        return self._entries().items()

    def values(self) -> Any:
        return self._entries().values()

    def keys(self) -> Any:
        return self._entries().keys()

    def _entries(self) -> dict[str, Entry]:
        """Every entry, built once; the containers checked the first time."""
        if self._built is None:
            c = self._columns
            ranks = c.entry["rank"].tolist()
            slots: list[Entry | None] = [None] * len(c.paths)
            for i, entry in c.all_tensors():
                slots[i] = entry
            rows = iter(self._rows)
            entries = [slot if slot is not None else next(rows) for slot in slots]
            paths = c.paths
            built = {f"{ranks[i]}/{paths[i]}": entries[i] for i in np.argsort(c.entry["order"]).tolist()}
            check_containers(built)
            self._built = built
        return self._built
