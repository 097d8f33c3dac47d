"""Statistics of a stored tensor, computed as its pieces stream by (never the whole tensor at once).

Raw tensors and sharded tensors are read piece by piece through the restore side's fetch (a
piece larger than the memory budget in sub-ranges of it); each chunk is folded into running
statistics in float64 (Chan's parallel update for mean and variance), so memory stays within the
budget plus a bounded conversion buffer, whatever the tensor's size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from snapshotkit._format.entries import Piece, ShardedTensorEntry, TensorEntry
from snapshotkit._format.serialization import dtype_from_name, tensor_from_bytes
from snapshotkit._format.sharded import Box, piece_boxes
from snapshotkit._inspect.reader import SnapshotReader
from snapshotkit._restore.fetch import PieceRead

#: Elements converted to float64 at once (8 MiB), whatever the size of the chunk read.
_CONVERT_ELEMENTS = 1 << 20


@functools.cache
def is_numeric(dtype: torch.dtype) -> bool:
    """Whether elements of ``dtype`` convert to float64/complex128 (not the bit and sub-byte dtypes)."""
    try:
        torch.zeros(1, dtype=dtype).to(torch.complex128 if dtype.is_complex else torch.float64)
    except (RuntimeError, TypeError):
        return False
    return True


@dataclasses.dataclass(frozen=True)
class TensorStats:
    """Statistics of a tensor's elements, in float64 (of ``|x|`` for complex dtypes).

    ``minimum``, ``maximum``, ``mean`` and ``std`` cover the finite elements only (None when there
    are none; ``std`` is the sample standard deviation, ``torch.std``'s default, None below two
    elements); ``nan`` and ``inf`` count the others.
    """

    count: int
    finite: int
    nan: int
    inf: int
    minimum: float | None
    maximum: float | None
    mean: float | None
    std: float | None
    of_abs: bool


class StatsAccumulator:
    """Running statistics over chunks of elements, folded in any order from any thread."""

    def __init__(self, dtype: torch.dtype, first_count: int) -> None:
        self.dtype = dtype
        self.first: dict[int, Any] = {}
        self._first_count = first_count
        self._lock = threading.Lock()
        self._count = self._finite = self._nan = self._inf = 0
        self._min = math.inf
        self._max = -math.inf
        self._mean = self._m2 = 0.0

    def add(self, values: torch.Tensor) -> None:
        """Fold in a flat tensor of elements of :attr:`dtype`."""
        for start in range(0, values.numel(), _CONVERT_ELEMENTS):
            self._add_chunk(values[start : start + _CONVERT_ELEMENTS])

    def note_first(self, index: int, value: torch.Tensor) -> None:
        """Record element ``index`` (row-major) if it is among the first ones shown."""
        if index < self._first_count:
            with self._lock:
                self.first[index] = value.item()

    def _add_chunk(self, chunk: torch.Tensor) -> None:
        x = chunk.to(torch.complex128).abs() if self.dtype.is_complex else chunk.to(torch.float64)
        finite_mask = torch.isfinite(x)
        nan = int(torch.isnan(x).sum())
        finite = x[finite_mask]
        n = finite.numel()
        if n:
            low, high = float(finite.min()), float(finite.max())
            mean = float(finite.mean())
            m2 = float(((finite - mean) ** 2).sum())
        with self._lock:
            self._count += chunk.numel()
            self._nan += nan
            self._inf += chunk.numel() - n - nan
            if n:
                total = self._finite + n
                delta = mean - self._mean
                self._mean += delta * n / total
                self._m2 += m2 + delta * delta * self._finite * n / total
                self._finite = total
                self._min, self._max = min(self._min, low), max(self._max, high)

    def result(self) -> TensorStats:
        finite = self._finite
        return TensorStats(
            count=self._count,
            finite=finite,
            nan=self._nan,
            inf=self._inf,
            minimum=self._min if finite else None,
            maximum=self._max if finite else None,
            mean=self._mean if finite else None,
            std=math.sqrt(self._m2 / (finite - 1)) if finite > 1 else None,
            of_abs=self.dtype.is_complex,
        )

    def first_values(self) -> list[Any]:
        return [self.first[i] for i in sorted(self.first)]


def stream_stats(
    reader: SnapshotReader, logical_path: str, entry: TensorEntry | ShardedTensorEntry, first_count: int
) -> StatsAccumulator:
    """Statistics and the first ``first_count`` elements (row-major) of a raw or sharded tensor,
    read piece by piece under ``reader``'s budget. The dtype must be :func:`is_numeric`."""
    dtype = dtype_from_name(entry.dtype)
    stats = StatsAccumulator(dtype, first_count)
    itemsize = dtype.itemsize
    reads: list[PieceRead] = []
    if isinstance(entry, TensorEntry):
        start = 0
        for piece in entry.pieces:
            reads.append(_read(logical_path, piece, stats, itemsize, _flat_firsts(start, first_count)))
            start += piece.nbytes // itemsize
    else:
        wanted = [_unravel(i, entry.shape) for i in range(min(first_count, math.prod(entry.shape)))]
        for shard in entry.shards:
            shard_box = Box(shard.offsets, shard.sizes)
            sizes = [piece.nbytes for piece in shard.pieces]
            for piece, box in zip(shard.pieces, piece_boxes(shard_box, sizes, itemsize), strict=True):
                reads.append(_read(logical_path, piece, stats, itemsize, _box_firsts(box, wanted, entry.shape)))
    reader.run(reader.fetch(reads))
    return stats


def _read(
    logical_path: str,
    piece: Piece,
    stats: StatsAccumulator,
    itemsize: int,
    firsts: Callable[[int, int], list[tuple[int, int]]],
) -> PieceRead:
    def consume(within: int, data: memoryview) -> None:
        values = tensor_from_bytes(data, stats.dtype, (data.nbytes // itemsize,))
        first_element = within // itemsize
        for index, local in firsts(first_element, first_element + values.numel()):
            stats.note_first(index, values[local - first_element])
        stats.add(values)

    return PieceRead(piece, logical_path, consume=consume, splittable=True, itemsize=itemsize)


def _flat_firsts(start: int, first_count: int) -> Callable[[int, int], list[tuple[int, int]]]:
    """For a piece holding elements from ``start`` on: the wanted (index, element within the piece) in a range."""

    def firsts(low: int, high: int) -> list[tuple[int, int]]:
        return [(start + local, local) for local in range(low, min(high, first_count - start))]

    return firsts


def _box_firsts(
    box: Box, wanted: list[tuple[int, ...]], shape: tuple[int, ...]
) -> Callable[[int, int], list[tuple[int, int]]]:
    """As :func:`_flat_firsts` for a piece that is the box ``box`` of the global tensor."""
    inside = []
    for coords in wanted:
        if all(o <= c < o + n for c, o, n in zip(coords, box.offsets, box.sizes, strict=True)):
            local = _ravel(tuple(c - o for c, o in zip(coords, box.offsets, strict=True)), box.sizes)
            inside.append((_ravel(coords, shape), local))

    def firsts(low: int, high: int) -> list[tuple[int, int]]:
        return [(index, local) for index, local in inside if low <= local < high]

    return firsts


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        index, coord = divmod(index, size)
        coords.append(coord)
    return tuple(reversed(coords))


def _ravel(coords: tuple[int, ...], shape: tuple[int, ...]) -> int:
    index = 0
    for coord, size in zip(coords, shape, strict=True):
        index = index * size + coord
    return index


def tensor_stats(value: torch.Tensor, first_count: int) -> StatsAccumulator:
    """The same statistics of a tensor already in memory (a ``torch_save`` tensor read whole)."""
    if value.is_quantized:
        value = value.dequantize()
    elif value.layout != torch.strided:
        value = value.to_dense()
    flat = value.detach().reshape(-1)
    stats = StatsAccumulator(flat.dtype, first_count)
    if is_numeric(flat.dtype):
        for index in range(min(first_count, flat.numel())):
            stats.note_first(index, flat[index])
        stats.add(flat)
    return stats
