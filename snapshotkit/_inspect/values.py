"""Comparing tensor values chunk by chunk: how many elements differ beyond a tolerance, and by how much.

Elements are equal when ``torch.isclose(a, b, rtol, atol, equal_nan=True)`` holds in float64
(complex128 for complex dtypes); integers compared without tolerance are compared exactly in
their own dtype (float64 would round int64 values past 2**53); dtypes without a numeric value
(bits, sub-byte) compare bit for bit. Conversions run on bounded slices, whatever the chunk size.
"""

from __future__ import annotations

import math
import threading

import torch

from snapshotkit._inspect.stats import is_numeric

_CONVERT_ELEMENTS = 1 << 20


class DifferenceAccumulator:
    """Mismatched elements and the largest ``|a - b|`` over pairs of equally long flat chunks."""

    def __init__(self, dtype: torch.dtype, atol: float, rtol: float) -> None:
        self.dtype = dtype
        self.atol = atol
        self.rtol = rtol
        self.mismatched = 0
        self.max_abs_diff: float | None = 0.0 if is_numeric(dtype) else None
        self._lock = threading.Lock()

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Fold in elements ``a`` and ``b`` (flat, same length, both of :attr:`dtype`)."""
        for start in range(0, a.numel(), _CONVERT_ELEMENTS):
            end = start + _CONVERT_ELEMENTS
            mismatched, largest = self._compare(a[start:end], b[start:end])
            with self._lock:
                self.mismatched += mismatched
                if largest is not None and self.max_abs_diff is not None:
                    self.max_abs_diff = max(self.max_abs_diff, largest)

    def _compare(self, a: torch.Tensor, b: torch.Tensor) -> tuple[int, float | None]:
        if not is_numeric(self.dtype):
            itemsize = self.dtype.itemsize
            rows_a, rows_b = a.view(torch.uint8).view(-1, itemsize), b.view(torch.uint8).view(-1, itemsize)
            return int((rows_a != rows_b).any(dim=1).sum()), None
        wide = torch.complex128 if self.dtype.is_complex else torch.float64
        a64, b64 = a.to(wide), b.to(wide)
        exact = self.atol == 0 and self.rtol == 0
        if exact and not (self.dtype.is_floating_point or self.dtype.is_complex):
            mismatched = int((a != b).sum())
        else:
            mismatched = int((~torch.isclose(a64, b64, rtol=self.rtol, atol=self.atol, equal_nan=True)).sum())
        if mismatched == 0:
            return 0, 0.0
        both_finite = torch.isfinite(a64) & torch.isfinite(b64)
        gaps = (a64 - b64).abs()[both_finite]
        largest = float(gaps.max()) if gaps.numel() else 0.0
        return mismatched, largest if math.isfinite(largest) else None
