"""Comparing two snapshots logical path by logical path, tensor values under one memory budget.

Structure first (from the manifests alone): paths only one side has, kinds, dtypes and shapes,
primitives. Then values, tensor by tensor and never a whole snapshot: tensors whose two sides fit
in the budget together are read in groups that fit it (one batched read per side, as a restore
reads); a larger pair is compared piece by piece (one stored piece of each side in memory at a
time) when both sides are raw tensors or sharded tensors with the same boxes, and read whole
otherwise. Objects are compared by the SHA-256 of their stored bytes, streamed, never unpickled;
objects whose checksums differ differ without a read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch

from snapshotkit._format.document import SnapshotMetadata
from snapshotkit._format.entries import Entry, ObjectEntry, Piece, PrimitiveEntry, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import byte_view, dtype_from_name
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._inspect.summary import entry_kind, is_container, is_empty_container
from snapshotkit._inspect.values import DifferenceAccumulator
from snapshotkit._restore.fetch import Claim, PieceRead
from snapshotkit._runtime.loop import gather_or_cancel

TensorLike = TensorEntry | ShardedTensorEntry
_REPR_CHARS = 60


@dataclasses.dataclass(frozen=True)
class PathChange:
    """A logical path both snapshots hold, with different contents.

    Attributes:
        logical_path: the logical path (``"<rank>/<logical path>"`` unless both snapshots were
            taken by one rank).
        what: the first difference found: ``"kind"`` (a tensor here, an object there...),
            ``"dtype"``, ``"shape"``, ``"values"`` (tensor elements differ beyond the tolerance)
            or ``"value"`` (a primitive or object differs).
        a: A's side, described (``"tensor float32 [2, 3]"``, ``"primitive int 3"``...).
        b: B's side, described.
        max_abs_diff: for ``"values"``: the largest ``|a - b|`` (float64; of the complex
            difference's magnitude) over elements finite on both sides; None for dtypes without a
            numeric value and otherwise.
        mismatched: for ``"values"``: how many elements differ beyond the tolerance (a NaN on one
            side only counts); None otherwise.
    """

    logical_path: str
    what: str
    a: str
    b: str
    max_abs_diff: float | None = None
    mismatched: int | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Paths only B has, only A has (each in its snapshot's order), changes, and the paths both have."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[PathChange, ...]
    compared: int


def leaf_entries(metadata: SnapshotMetadata, strip_rank: bool) -> dict[str, Entry]:
    """Path -> entry of every leaf and empty container (the path without ``"0/"`` if ``strip_rank``)."""
    return {
        (key.partition("/")[2] if strip_rank else key): entry
        for key, entry in metadata.manifest.items()
        if not is_container(entry) or is_empty_container(entry)
    }


def describe(entry: Entry) -> str:
    """A short description: ``tensor float32 [2, 3]``, ``object set (120 bytes)``, ``primitive int 3``."""
    if isinstance(entry, (TensorEntry, ShardedTensorEntry)):
        return f"{entry_kind(entry)} {_dtype_shape(entry)}"
    if isinstance(entry, ObjectEntry):
        return f"object {entry.obj_type} ({entry.piece.nbytes} bytes)"
    if isinstance(entry, PrimitiveEntry):
        text = repr(entry.value)
        return f"primitive {entry.value_type} {text if len(text) <= _REPR_CHARS else text[:_REPR_CHARS] + '...'}"
    return f"{entry_kind(entry)} (empty)"


def _dtype_shape(entry: TensorLike) -> str:
    return f"{entry.dtype} {list(entry.shape)}"


def compare_snapshots(
    reader_a: SnapshotReader,
    metadata_a: SnapshotMetadata,
    reader_b: SnapshotReader,
    metadata_b: SnapshotMetadata,
    *,
    atol: float,
    rtol: float,
) -> Comparison:
    """Compare snapshot A with snapshot B (see the module docstring)."""
    strip = metadata_a.world_size == 1 and metadata_b.world_size == 1
    side_a, side_b = leaf_entries(metadata_a, strip), leaf_entries(metadata_b, strip)
    common = [path for path in side_a if path in side_b]
    changes: dict[str, PathChange] = {}
    tensors: list[tuple[str, TensorLike, TensorLike]] = []
    objects: list[tuple[str, ObjectEntry, ObjectEntry]] = []
    for path in common:
        a, b = side_a[path], side_b[path]
        change = _structural_change(path, a, b, atol, rtol)
        if change is not None:
            changes[path] = change
        elif isinstance(a, (TensorEntry, ShardedTensorEntry)) and isinstance(b, (TensorEntry, ShardedTensorEntry)):
            tensors.append((path, a, b))
        elif isinstance(a, ObjectEntry) and isinstance(b, ObjectEntry):
            objects.append((path, a, b))
    values = _ValueComparer(reader_a, reader_b, atol, rtol)
    for change in [*values.tensors(tensors), *values.objects(objects)]:
        changes[change.logical_path] = change
    return Comparison(
        added=tuple(path for path in side_b if path not in side_a),
        removed=tuple(path for path in side_a if path not in side_b),
        changed=tuple(changes[path] for path in common if path in changes),
        compared=len(common),
    )


def _structural_change(path: str, a: Entry, b: Entry, atol: float, rtol: float) -> PathChange | None:
    tensor_kinds = ("tensor", "sharded_tensor")
    kind_a, kind_b = entry_kind(a), entry_kind(b)
    if kind_a != kind_b and not (kind_a in tensor_kinds and kind_b in tensor_kinds):
        return PathChange(path, "kind", describe(a), describe(b))
    if isinstance(a, (TensorEntry, ShardedTensorEntry)) and isinstance(b, (TensorEntry, ShardedTensorEntry)):
        if a.dtype != b.dtype:
            return PathChange(path, "dtype", _dtype_shape(a), _dtype_shape(b))
        if a.shape != b.shape:
            return PathChange(path, "shape", _dtype_shape(a), _dtype_shape(b))
        return None
    if isinstance(a, PrimitiveEntry) and isinstance(b, PrimitiveEntry):
        return None if _same_primitive(a, b, atol, rtol) else PathChange(path, "value", describe(a), describe(b))
    if (
        isinstance(a, ObjectEntry)
        and isinstance(b, ObjectEntry)
        and (a.piece.nbytes != b.piece.nbytes or a.piece.checksum != b.piece.checksum)
    ):
        return PathChange(path, "value", describe(a), describe(b))  # other checksums: other bytes, no need to read
    return None


def _same_primitive(a: PrimitiveEntry, b: PrimitiveEntry, atol: float, rtol: float) -> bool:
    numbers = ("int", "float")
    if a.value_type in numbers and b.value_type in numbers:
        x, y = float(a.value), float(b.value)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return bool(x == y or abs(x - y) <= atol + rtol * abs(y))
    return a.value_type == b.value_type and a.value == b.value


class _ValueComparer:
    """Reads both sides' values under the budget the two readers share, and compares them."""

    def __init__(self, reader_a: SnapshotReader, reader_b: SnapshotReader, atol: float, rtol: float) -> None:
        self.a, self.b = reader_a, reader_b
        self.atol, self.rtol = atol, rtol
        self.budget_bytes = reader_a.budget.total_bytes

    def tensors(self, pairs: Sequence[tuple[str, TensorLike, TensorLike]]) -> Iterator[PathChange]:
        group: list[tuple[str, TensorLike, TensorLike]] = []
        group_bytes = 0
        for path, a, b in pairs:
            size = a.nbytes + b.nbytes
            if size > self.budget_bytes:
                yield from self._group(group)
                group, group_bytes = [], 0
                change = self._large(path, a, b)
                if change is not None:
                    yield change
                continue
            if group_bytes + size > self.budget_bytes:
                yield from self._group(group)
                group, group_bytes = [], 0
            group.append((path, a, b))
            group_bytes += size
        yield from self._group(group)

    def _group(self, group: Sequence[tuple[str, TensorLike, TensorLike]]) -> Iterator[PathChange]:
        if not group:
            return
        values_a = self.a.load({path: a for path, a, _ in group})
        values_b = self.b.load({path: b for path, _, b in group})
        for path, a, _ in group:
            change = self._in_memory(path, a, values_a.pop(path), values_b.pop(path))
            if change is not None:
                yield change

    def _in_memory(self, path: str, a: TensorLike, value_a: torch.Tensor, value_b: torch.Tensor) -> PathChange | None:
        flat_a, flat_b = _flat(value_a), _flat(value_b)
        if flat_a.dtype != flat_b.dtype or flat_a.shape != flat_b.shape:
            return PathChange(path, "values", _dtype_shape(a), f"stored as {flat_b.dtype} {list(value_b.shape)}")
        accumulator = DifferenceAccumulator(flat_a.dtype, self.atol, self.rtol)
        accumulator.add(flat_a, flat_b)
        return self._change(path, a, accumulator)

    def _change(self, path: str, a: TensorLike, accumulator: DifferenceAccumulator) -> PathChange | None:
        if not accumulator.mismatched:
            return None
        what = _dtype_shape(a)
        return PathChange(path, "values", what, what, accumulator.max_abs_diff, accumulator.mismatched)

    def _large(self, path: str, a: TensorLike, b: TensorLike) -> PathChange | None:
        """A pair larger than the budget: piece by piece when the layouts allow, else whole."""
        blocks = _aligned_blocks(a, b)
        if blocks is None:
            value_a = self.a.load({path: a})[path]
            return self._in_memory(path, a, value_a, self.b.load({path: b})[path])
        dtype = dtype_from_name(a.dtype)
        accumulator = DifferenceAccumulator(dtype, self.atol, self.rtol)
        for reader, side in ((self.a, a), (self.b, b)):
            pieces = side.pieces if isinstance(side, TensorEntry) else [p for s in side.shards for p in s.pieces]
            reader.run(reader.prove([Claim(path, piece, True) for piece in pieces if piece.nbytes]))
        for pieces_a, pieces_b in blocks:
            self._merge(path, dtype, pieces_a, pieces_b, accumulator)
        return self._change(path, a, accumulator)

    def _merge(
        self,
        path: str,
        dtype: torch.dtype,
        pieces_a: Sequence[Piece],
        pieces_b: Sequence[Piece],
        accumulator: DifferenceAccumulator,
    ) -> None:
        """Walk two piece lists of the same flat elements, holding one piece of each side at a time."""
        spans_a, spans_b = _spans(pieces_a, dtype.itemsize), _spans(pieces_b, dtype.itemsize)
        held_a: tuple[torch.Tensor, int, int] | None = None
        held_b: tuple[torch.Tensor, int, int] | None = None
        position = 0
        while True:
            span_a = next(spans_a, None) if held_a is None or held_a[2] <= position else None
            span_b = next(spans_b, None) if held_b is None or held_b[2] <= position else None
            if (span_a is None and (held_a is None or held_a[2] <= position)) or (
                span_b is None and (held_b is None or held_b[2] <= position)
            ):
                return  # both sides hold the same number of elements: they end together
            reads = []
            if span_a is not None:
                held_a = (_empty(span_a[0], dtype), span_a[1], span_a[2])
                reads.append(self.a.fetch([PieceRead(span_a[0], path, direct=byte_view(held_a[0]))]))
            if span_b is not None:
                held_b = (_empty(span_b[0], dtype), span_b[1], span_b[2])
                reads.append(self.b.fetch([PieceRead(span_b[0], path, direct=byte_view(held_b[0]))]))
            self.a.run(gather_or_cancel(reads))
            assert held_a is not None
            assert held_b is not None
            end = min(held_a[2], held_b[2])
            accumulator.add(
                held_a[0][position - held_a[1] : end - held_a[1]], held_b[0][position - held_b[1] : end - held_b[1]]
            )
            position = end

    def objects(self, pairs: Sequence[tuple[str, ObjectEntry, ObjectEntry]]) -> Iterator[PathChange]:
        if not pairs:
            return
        digests_a = self._digests(self.a, [(path, a.piece) for path, a, _ in pairs])
        digests_b = self._digests(self.b, [(path, b.piece) for path, _, b in pairs])
        for (path, a, b), digest_a, digest_b in zip(pairs, digests_a, digests_b, strict=True):
            if digest_a.digest() != digest_b.digest():
                yield PathChange(path, "value", describe(a), describe(b))

    @staticmethod
    def _digests(reader: SnapshotReader, pieces: Sequence[tuple[str, Piece]]) -> list[hashlib._Hash]:
        """SHA-256 of each piece's bytes, streamed (a piece's sub-ranges are handed over in order)."""
        hashes = [hashlib.sha256() for _ in pieces]
        reads = [
            PieceRead(piece, path, consume=_hashing(h), splittable=True)
            for (path, piece), h in zip(pieces, hashes, strict=True)
        ]
        reader.run(reader.fetch(reads))
        return hashes


def _hashing(digest: hashlib._Hash) -> Callable[[int, memoryview], None]:
    def consume(within: int, data: memoryview) -> None:
        digest.update(data)

    return consume


def _flat(value: torch.Tensor) -> torch.Tensor:
    if value.is_quantized:
        value = value.dequantize()
    elif value.layout != torch.strided:
        value = value.to_dense()
    return value.detach().reshape(-1)


def _empty(piece: Piece, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(piece.nbytes // dtype.itemsize, dtype=dtype)


def _spans(pieces: Sequence[Piece], itemsize: int) -> Iterator[tuple[Piece, int, int]]:
    """Each non-empty piece with the flat elements ``[start, end)`` it holds."""
    start = 0
    for piece in pieces:
        count = piece.nbytes // itemsize
        if count:
            yield piece, start, start + count
        start += count


def _aligned_blocks(a: TensorLike, b: TensorLike) -> list[tuple[tuple[Piece, ...], tuple[Piece, ...]]] | None:
    """Pairs of piece lists holding the same flat elements on both sides, or None if the layouts differ."""
    if isinstance(a, TensorEntry) and isinstance(b, TensorEntry):
        if a.serializer == b.serializer == "raw":
            return [(a.pieces, b.pieces)]
        return None
    if isinstance(a, ShardedTensorEntry) and isinstance(b, ShardedTensorEntry):
        boxes_b = {(s.offsets, s.sizes): s.pieces for s in b.shards}
        if len(boxes_b) != len(b.shards) or {(s.offsets, s.sizes) for s in a.shards} != set(boxes_b):
            return None
        return [(s.pieces, boxes_b[(s.offsets, s.sizes)]) for s in a.shards]
    return None
