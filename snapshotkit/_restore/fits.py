"""Whether a destination can receive a saved tensor in place, and what to say when it cannot.

Planning a restore asks this of every destination (:mod:`.plan`, :mod:`.columns`), the loader
(:mod:`.place`) of tied ones, which share memory: whether two read the same bytes, and whether a
lazy conj or neg bit makes one memory read differently through two views.
"""

from __future__ import annotations

import torch

from snapshotkit._format.entries import TensorEntry
from snapshotkit._format.serialization import dtype_name
from snapshotkit.errors import StateMismatchError

__all__ = [
    "DTYPE_NAMES",
    "describe_mismatch",
    "lazy_bits",
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
