"""Whether a destination can receive a saved tensor in place, and what to say when it cannot.

Planning a restore asks this of every destination (:mod:`.plan`, :mod:`.columns`), the loader
(:mod:`.place`) of tied ones, which share memory: whether two read the same bytes, and whether a
lazy conj or neg bit makes one memory read differently through two views.
"""

from __future__ import annotations

from typing import Any

import torch

from snapshotkit._format.entries import TensorEntry
from snapshotkit._format.serialization import RAW, dtype_name
from snapshotkit.errors import StateMismatchError

__all__ = [
    "DTYPE_NAMES",
    "can_receive",
    "describe_mismatch",
    "describe_unfit_loaded",
    "lazy_bits",
    "receive_loaded",
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
    if entry.serializer == RAW:
        saved = f"a dense tensor of dtype {entry.dtype} shape {list(entry.shape)}"
        cannot = "which cannot take the saved dense bytes"
    else:  # stored whole with torch.save: its layout is known once loaded, a destination's only dense
        saved = f"a tensor of dtype {entry.dtype} shape {list(entry.shape)} stored with torch.save"
        cannot = "and only a dense tensor is restored in place"
    if value.layout != torch.strided or value.is_quantized:  # the dtype and shape may well match
        kind = "quantized" if value.is_quantized else str(value.layout).removeprefix("torch.")
        found = f"a {kind} tensor of dtype {dtype} shape {list(value.shape)}, {cannot}"
    else:
        found = f"dtype {dtype} shape {list(value.shape)}"
    return StateMismatchError(
        f"cannot restore {logical_path!r} in place: the snapshot has {saved}, the destination is {found}. Build "
        "the destination with the saved layout, shape and dtype, or pass strict=False to load a new tensor and "
        "let load_state_dict() convert it (read_object: obj_out=None)"
    )


def can_receive(destination: torch.Tensor, loaded: torch.Tensor) -> bool:
    """Whether ``loaded`` (a tensor stored with ``torch.save``, loaded) can be copied into
    ``destination`` (a dense tensor :func:`tensor_matches` accepted for its entry): the same dtype
    and shape, and dense too. The manifest records no layout, so a sparse, quantized or nested
    value is known only here, once loaded."""
    return (
        loaded.layout == torch.strided
        and not loaded.is_quantized
        and not loaded.is_nested
        and loaded.dtype == destination.dtype
        and loaded.shape == destination.shape
    )


def receive_loaded(logical_path: str, destination: torch.Tensor, loaded: torch.Tensor, or_new: bool) -> Any:
    """Copy ``loaded`` into ``destination`` and give ``destination``; if it cannot take it
    (:func:`can_receive`), give ``loaded`` with ``or_new``, else refuse.

    Raises:
        StateMismatchError: ``destination`` cannot take ``loaded`` and ``or_new`` is false.
    """
    if can_receive(destination, loaded):
        destination.detach().copy_(loaded)
        return destination
    if or_new:
        return loaded
    raise describe_unfit_loaded(logical_path, loaded, destination)


def describe_unfit_loaded(logical_path: str, loaded: torch.Tensor, destination: torch.Tensor) -> StateMismatchError:
    """Why ``loaded`` cannot be copied into ``destination`` (:func:`can_receive` is false)."""
    if loaded.is_quantized or loaded.layout != torch.strided or loaded.is_nested:
        layout = "nested" if loaded.is_nested else str(loaded.layout).removeprefix("torch.")
        kind = "quantized" if loaded.is_quantized else layout
        saved = f"a {kind} tensor"
    else:
        saved = "a tensor"
    return StateMismatchError(
        f"cannot restore {logical_path!r} in place: the snapshot has {saved} of dtype "
        f"{str(loaded.dtype).removeprefix('torch.')} shape {list(loaded.shape)}, the destination is a dense tensor "
        f"of dtype {str(destination.dtype).removeprefix('torch.')} shape {list(destination.shape)}, which cannot "
        "take its values as they are. Build the destination with the saved layout (e.g. .to_sparse()), pass "
        "strict=False to hand the saved tensor to load_state_dict(), or read it with obj_out=None"
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
