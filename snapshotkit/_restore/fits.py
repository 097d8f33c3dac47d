"""Whether a destination can receive a saved tensor in place, and what to say when it cannot.

Planning a restore asks this of every destination (:mod:`.plan`, :mod:`.columns`), the loader
(:mod:`.place`) of tied ones, which share memory: whether two read the same bytes, and whether a
lazy conj or neg bit makes one memory read differently through two views.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from snapshotkit._format.entries import TensorEntry
from snapshotkit._format.serialization import dtype_name
from snapshotkit._restore.runs import InPlaceRun
from snapshotkit.errors import StateMismatchError

__all__ = [
    "DTYPE_NAMES",
    "describe_mismatch",
    "internal_overlap",
    "lazy_bits",
    "overlapping_memory",
    "same_bytes",
    "tensor_matches",
]


def tensor_matches(entry: TensorEntry, value: object) -> bool:
    """Whether ``value`` can receive ``entry`` in place (a tensor of the same dtype and shape; a
    ``DTensor``/``ShardedTensor`` is filled shard by shard, see :meth:`LeafLoader.add`)."""
    # Cheapest refusals first: restoring many small tensors calls this once per entry.
    return (
        isinstance(value, torch.Tensor)
        and value.shape == entry.shape
        and DTYPE_NAMES.get(value.dtype) == entry.dtype
        and value.layout == torch.strided
        and not value.is_quantized
    )


#: torch dtype -> manifest name, built once: ``str(dtype)`` costs a microsecond per call.
DTYPE_NAMES: dict[torch.dtype, str] = {d: dtype_name(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}


def describe_mismatch(logical_path: str, entry: TensorEntry, value: torch.Tensor) -> StateMismatchError:
    """Why ``value`` cannot receive ``entry`` in place (:func:`tensor_matches` is false)."""
    dtype = str(value.dtype).removeprefix("torch.")
    if value.layout != torch.strided or value.is_quantized:  # the dtype and shape may well match
        kind = "quantized" if value.is_quantized else str(value.layout).removeprefix("torch.")
        found = f"a {kind} tensor of dtype {dtype} shape {list(value.shape)}, which cannot take the saved dense bytes"
    else:
        found = f"dtype {dtype} shape {list(value.shape)}"
    return StateMismatchError(
        f"cannot restore {logical_path!r} in place: the snapshot has a dense tensor of dtype {entry.dtype} shape "
        f"{list(entry.shape)}, the destination is {found}. Build the destination with the saved layout, "
        "shape and dtype, or pass strict=False to load a new tensor and let load_state_dict() convert it"
    )


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype and shape hold the same bytes (NaNs included); a lazy
    conj or neg bit counts as applied (the values the tensor reads as)."""

    def as_bytes(t: torch.Tensor) -> torch.Tensor:
        return t.cpu().resolve_conj().resolve_neg().reshape(-1).contiguous().view(torch.uint8)

    return torch.equal(as_bytes(a), as_bytes(b))


def lazy_bits(target: torch.Tensor) -> int:
    """1 for a lazy conj bit, 2 for a lazy neg bit (0 for the plain tensors of the fast paths)."""
    return int(target.is_conj()) | 2 * int(target.is_neg())


def internal_overlap(destination: torch.Tensor) -> bool:
    """Whether elements of ``destination`` share memory (an ``expand()``ed or broadcast view: a
    dimension of more than one element with stride 0), so it cannot hold distinct saved values."""
    return destination.layout == torch.strided and any(
        stride == 0 and size > 1 for size, stride in zip(destination.shape, destination.stride(), strict=True)
    )


def overlapping_memory(spans: Sequence[tuple[int, int, str]], runs: Sequence[InPlaceRun]) -> None:
    """Refuse in-place destinations whose memory partly overlaps: ``spans`` ``(address, nbytes,
    logical path)`` and the ``runs``' destinations, all contiguous CPU memory, none the very same
    memory as another (tied destinations are read once, or compared). Reading both would leave
    one holding part of the other's bytes: a checksum failure blamed on the snapshot, or, when
    one is verified before the other lands, a wrong value and no error.

    Raises:
        StateMismatchError: naming two such logical paths.
    """
    if len(spans) + sum(len(run.paths) for run in runs) < 2:
        return
    starts = np.concatenate([np.array([s[0] for s in spans], dtype=np.int64), *(run.addresses for run in runs)])
    ends = starts + np.concatenate([np.array([s[1] for s in spans], dtype=np.int64), *(run.length for run in runs)])
    order = np.argsort(starts, kind="stable")
    # sorted by start, an overlap anywhere is an overlap of neighbours
    bad = np.flatnonzero(starts[order[1:]] < ends[order[:-1]])
    if not len(bad):
        return
    paths = [s[2] for s in spans] + [path for run in runs for path in run.paths]
    first, second = sorted((paths[int(order[bad[0]])], paths[int(order[bad[0] + 1])]))
    raise StateMismatchError(
        f"cannot restore {first!r} and {second!r} in place: their tensors in the app state partly share memory "
        "(overlapping views of one storage), so reading one would overwrite part of the other. Restore into "
        "separate tensors, or tie them as one tensor"
    )
