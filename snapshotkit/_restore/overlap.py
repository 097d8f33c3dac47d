"""Destinations whose memory overlaps: a restore reads into them in place only if no byte of
one is a byte of another, or of itself.

Two destinations that view the very same elements (tied) are read once, or compared
(:mod:`.place`). Anything else that shares memory cannot hold the saved values of both: reading
one overwrites part of the other (a checksum failure blamed on the snapshot, or, when one is
verified before the other lands, a wrong value and no error), and a tensor whose own elements
share memory cannot hold distinct values at all. Both are refused at planning, before any read.

Contiguous destinations (nearly all) are byte ranges, checked as sorted arrays. A strided one
is first taken as the range from its first to its last byte; only ranges that meet are then
compared element by element, in a mask of the memory they cover.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from snapshotkit._restore.runs import InPlaceRun
from snapshotkit.errors import StateMismatchError

__all__ = ["internal_overlap", "overlapping_memory"]


def internal_overlap(destination: torch.Tensor) -> bool:
    """Whether elements of the strided tensor ``destination`` share memory (``expand()``,
    ``unfold()``, an ``as_strided`` view), so it cannot hold distinct saved values."""
    if destination.layout != torch.strided:
        return False
    dims = sorted(
        (stride, size) for size, stride in zip(destination.shape, destination.stride(), strict=True) if size > 1
    )
    reach = 0  # the furthest element offset the smaller strides reach
    for stride, size in dims:
        if stride <= reach:  # may overlap: decide element by element (rare)
            return _shares_elements(destination)
        reach += (size - 1) * stride
    return False


def _shares_elements(destination: torch.Tensor) -> bool:
    offsets = torch.arange(_extent(destination), dtype=torch.int64)
    viewed = offsets.as_strided(destination.shape, destination.stride()).reshape(-1)
    return int(torch.unique(viewed).numel()) != viewed.numel()


def _extent(tensor: torch.Tensor) -> int:
    """Elements from the tensor's first to its last element, both included."""
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)) + 1


def overlapping_memory(
    spans: Sequence[tuple[int, int, str]],
    runs: Sequence[InPlaceRun],
    strided: Sequence[tuple[torch.Tensor, str]] = (),
) -> None:
    """Refuse in-place destinations whose memory overlaps (module docstring), CPU and CUDA ones
    (one virtual address space): ``spans`` ``(address, nbytes, logical path)`` and the ``runs``'
    destinations are contiguous memory, ``strided`` ``(tensor, logical path)`` non-contiguous
    tensors; none the very same memory as another with the same view (tied destinations are read
    once, or compared).

    Raises:
        StateMismatchError: naming two logical paths whose memory overlaps.
    """
    strided = [(tensor, path) for tensor, path in strided if tensor.numel()]
    count = len(spans) + sum(len(run.paths) for run in runs) + len(strided)
    if count < 2:
        return
    reach = [_extent(tensor) * tensor.element_size() for tensor, _ in strided]
    starts = np.concatenate(
        [
            np.array([s[0] for s in spans], dtype=np.int64),
            *(run.addresses for run in runs),
            np.array([tensor.data_ptr() for tensor, _ in strided], dtype=np.int64),
        ]
    )
    ends = starts + np.concatenate(
        [
            np.array([s[1] for s in spans], dtype=np.int64),
            *(run.length for run in runs),
            np.array(reach, dtype=np.int64),
        ]
    )
    order = np.argsort(starts, kind="stable")
    ordered_ends = np.maximum.accumulate(ends[order])
    meets = np.flatnonzero(starts[order[1:]] < ordered_ends[:-1])  # member k+1 meets one before it
    if not len(meets):  # the common case
        return
    paths = [s[2] for s in spans] + [path for run in runs for path in run.paths] + [path for _, path in strided]
    first_strided = count - len(strided)
    exact_meets = [k for k in meets.tolist() if int(order[k + 1]) < first_strided]
    for k in exact_meets:  # a contiguous range that starts inside an earlier contiguous one overlaps it
        earlier = _earlier_exact(order[: k + 1], starts, ends, int(starts[order[k + 1]]), first_strided)
        if earlier is not None:
            _refuse(paths[earlier], paths[int(order[k + 1])])
    # the rest involves a strided destination: the clusters of meeting ranges, element by element
    members = _Members(starts, ends, strided, first_strided)
    cluster = [int(order[0])]
    cluster_end = int(ends[order[0]])
    for i in order[1:].tolist():
        if int(starts[i]) < cluster_end:
            cluster.append(i)
            cluster_end = max(cluster_end, int(ends[i]))
            continue
        _check_cluster(cluster, members, paths)
        cluster, cluster_end = [i], int(ends[i])
    _check_cluster(cluster, members, paths)


def _earlier_exact(
    before: np.ndarray, starts: np.ndarray, ends: np.ndarray, start: int, first_strided: int
) -> int | None:
    contiguous = before[before < first_strided]
    hit = contiguous[ends[contiguous] > start]
    return int(hit[0]) if len(hit) else None


@dataclasses.dataclass(frozen=True)
class _Members:
    """The destinations, by index: contiguous ones first, then ``strided`` from ``first_strided``."""

    starts: np.ndarray
    ends: np.ndarray
    strided: Sequence[tuple[torch.Tensor, str]]
    first_strided: int

    def view(self, mask: torch.Tensor, k: int, low: int, cell: int) -> torch.Tensor:
        """The cells of ``mask`` (one per ``cell`` bytes from address ``low``) member ``k`` covers."""
        offset = (int(self.starts[k]) - low) // cell
        if k < self.first_strided:
            return mask[offset : offset + (int(self.ends[k]) - int(self.starts[k])) // cell]
        tensor = self.strided[k - self.first_strided][0]
        size = tensor.element_size() // cell
        return mask.as_strided((*tensor.shape, size), (*(s * size for s in tensor.stride()), 1), offset)

    def cell(self, cluster: list[int], low: int) -> int:
        """The largest size that divides every offset from ``low``, length, element size and stride."""
        cell = 0
        for i in cluster:
            cell = math.gcd(cell, int(self.starts[i]) - low, int(self.ends[i]) - int(self.starts[i]))
            if i >= self.first_strided:
                tensor = self.strided[i - self.first_strided][0]
                cell = math.gcd(cell, tensor.element_size(), *(s * tensor.element_size() for s in tensor.stride()))
        return max(cell, 1)


def _check_cluster(cluster: list[int], members: _Members, paths: list[str]) -> None:
    """Refuse two members of ``cluster`` (ranges that meet) that share a byte, marking each
    member's bytes in a mask of the cluster's memory in turn."""
    if len(cluster) < 2 or all(i < members.first_strided for i in cluster):
        return
    low = int(members.starts[cluster].min())
    cell = members.cell(cluster, low)
    length = (int(members.ends[cluster].max()) - low) // cell
    taken = torch.zeros(length, dtype=torch.bool)
    for position, i in enumerate(cluster):
        view = members.view(taken, i, low, cell)
        if bool(view.any()):  # some earlier member: find which, to name it
            for j in cluster[:position]:
                pair = torch.zeros(length, dtype=torch.bool)
                members.view(pair, j, low, cell).fill_(True)
                if bool(members.view(pair, i, low, cell).any()):
                    _refuse(paths[j], paths[i])
        view.fill_(True)


def _refuse(first: str, second: str) -> None:
    first, second = sorted((first, second))
    raise StateMismatchError(
        f"cannot restore {first!r} and {second!r} in place: their tensors in the app state partly share memory "
        "(overlapping views of one storage), so reading one would overwrite part of the other. Restore into "
        "separate tensors, or tie them as one tensor"
    )
