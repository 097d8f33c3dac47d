"""Tensor <-> bytes without copies, and objects through ``torch.save``.

Raw tensors are stored as their contiguous row-major element bytes in native (little-endian)
order, with dtype and shape in the manifest. Everything raw storage cannot express (quantized
tensors, sparse and other non-strided layouts, tensor subclasses) and every non-tensor object is
stored as ``torch.save`` bytes and loaded with ``weights_only=True`` unless the caller opts out.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import math
import pickle
from typing import Any

import numpy as np
import torch

from snapshotkit._format.dtypes import RAW_ITEMSIZE
from snapshotkit.errors import ManifestError, SnapshotkitError, StateMismatchError, UnsafeObjectError

#: dtype name (``str(dtype)`` without ``torch.``) -> dtype, for every dtype this torch has.
_DTYPES_BY_NAME: dict[str, torch.dtype] = {
    str(value).removeprefix("torch."): value for value in vars(torch).values() if isinstance(value, torch.dtype)
}

#: Tensor classes whose storage is exactly their elements (``nn.Parameter`` is one).
_PLAIN_TENSOR_TYPES: tuple[type, ...] = (torch.Tensor, torch.nn.Parameter)

RAW = "raw"
TORCH_SAVE = "torch_save"


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest's name for ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float8_e4m3fn"``...)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`; a name this torch does not know is a manifest error."""
    try:
        return _DTYPES_BY_NAME[name]
    except KeyError:
        raise ManifestError(
            f"the manifest names dtype {name!r}, which torch {torch.__version__} does not have; "
            "read this snapshot with the torch version that wrote it"
        ) from None


def tensor_serializer(tensor: torch.Tensor) -> str:
    """``"raw"`` when the tensor's elements can be stored as plain bytes, else ``"torch_save"``."""
    if (
        type(tensor) in _PLAIN_TENSOR_TYPES
        and tensor.layout == torch.strided
        and dtype_name(tensor.dtype) in RAW_ITEMSIZE
        and not tensor.is_quantized
    ):
        return RAW
    return TORCH_SAVE


def is_zero_copy_source(tensor: torch.Tensor) -> bool:
    """Whether the tensor's own memory can be written out as it is, without a staging copy."""
    return tensor.is_cpu and tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()


def contiguous_cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A new contiguous CPU tensor with the same values (resolving lazy conj/neg views)."""
    source = tensor.detach().resolve_conj().resolve_neg()
    out = torch.empty(source.shape, dtype=source.dtype, device="cpu")
    copyable(out).copy_(copyable(source))
    return out


_memoryview_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_memoryview_from_memory.restype = ctypes.py_object
_memoryview_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_PYBUF_WRITE = 0x200


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A flat, writable byte memoryview of a contiguous CPU tensor's memory (shared, not copied).

    IMPORTANT: the view does not keep the tensor alive; the caller must hold a reference to the
    tensor for as long as it uses the view. (Going through numpy would keep it alive but costs
    ~5x more per tensor, which dominates snapshots of many small tensors.)
    """
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    if not (tensor.is_cpu and tensor.is_contiguous()):
        raise ValueError("byte_view needs a contiguous CPU tensor")
    view: memoryview = _memoryview_from_memory(tensor.data_ptr(), nbytes, _PYBUF_WRITE)
    return view


def memory_view(address: int, nbytes: int) -> memoryview:
    """:func:`byte_view` for a caller that checked the tensor (non-empty, contiguous, CPU) and
    holds its ``data_ptr()`` and size; the same IMPORTANT note applies."""
    view: memoryview = _memoryview_from_memory(address, nbytes, _PYBUF_WRITE)
    return view


def tensor_from_bytes(data: memoryview | bytes | bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing ``data`` (no copy) with the given dtype and shape."""
    array = np.frombuffer(data, dtype=np.uint8)
    flat = torch.from_numpy(array) if array.size else torch.empty(0, dtype=torch.uint8)
    if dtype != torch.uint8:
        flat = flat.view(dtype)
    return flat.reshape(shape)


@dataclasses.dataclass(frozen=True)
class Serialized:
    """A value someone already turned into ``torch.save`` bytes (a DCP ``BYTE_IO`` write item).

    A take stores ``data`` verbatim as the object's bytes (an object entry of type
    ``type_name``), so reading the object gives the value and reading its piece gives ``data``.
    """

    data: bytes
    type_name: str


def serialize_object(obj: Any) -> bytes:
    """``torch.save`` bytes of any picklable object (tensors inside it included)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def deserialize_object(data: bytes | memoryview, *, weights_only: bool, logical_path: str) -> Any:
    """Load ``torch.save`` bytes; with ``weights_only`` only tensors and plain containers load."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise _unloadable(logical_path, exc) from exc
        raise UnsafeObjectError(
            f"the object at logical path {logical_path!r} cannot be loaded with weights_only=True "
            f"({str(exc).splitlines()[0]}). If you trust this snapshot, pass weights_only=False to "
            "restore()/read_object(), or allow the class with torch.serialization.add_safe_globals()."
        ) from exc
    except (MemoryError, SnapshotkitError):
        raise
    except Exception as exc:  # unpickling runs the object's own code: a class gone, a changed __setstate__
        raise _unloadable(logical_path, exc) from exc


def _unloadable(logical_path: str, exc: BaseException) -> StateMismatchError:
    """The error for stored bytes (checksummed already) that unpickling in this program refuses."""
    first_line = (str(exc).splitlines() or [""])[0]
    return StateMismatchError(
        f"the object at logical path {logical_path!r} cannot be unpickled in this program "
        f"({type(exc).__name__}: {first_line}): a class or function it was pickled with is missing or has "
        "changed since the take. Import or define it as it was when the snapshot was taken (the same module "
        "and name), then restore or read it again"
    )


def flat_range_views(tensor: torch.Tensor, start: int, end: int) -> list[torch.Tensor]:
    """Views of ``tensor`` covering its elements ``[start, end)`` in row-major order.

    Works for any strides (non-contiguous and expanded views included): the range is cut into at
    most ``2 * ndim`` blocks, each a plain slice of ``tensor``, so copying block by block moves
    exactly the elements of the flat range. The blocks' ``numel`` sum to ``end - start``.
    """
    if start >= end:
        return []
    if tensor.dim() == 0:
        return [tensor.reshape(1)]
    if tensor.dim() == 1:
        return [tensor[start:end]]
    row = math.prod(tensor.shape[1:])
    first_row, first_col = divmod(start, row)
    last_row, last_col = divmod(end, row)
    if first_row == last_row:
        return flat_range_views(tensor[first_row], first_col, last_col)
    views: list[torch.Tensor] = []
    if first_col:
        views.extend(flat_range_views(tensor[first_row], first_col, row))
        first_row += 1
    if last_row > first_row:
        views.append(tensor[first_row:last_row])
    if last_col:
        views.extend(flat_range_views(tensor[last_row], 0, last_col))
    return views


#: The sub-byte integer dtypes (``torch.int1``..``int7``, ``uint1``..``uint7``, one byte an element in
#: memory) torch has no copy kernel for: they are copied as ``uint8`` views of the same bytes.
_NO_COPY_KERNEL: frozenset[torch.dtype] = frozenset(
    dtype
    for sign in ("", "u")
    for bits in range(1, 8)
    if isinstance(dtype := getattr(torch, f"{sign}int{bits}", None), torch.dtype)
)


def copyable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or for a dtype torch cannot ``copy_()`` (:data:`_NO_COPY_KERNEL`) a ``uint8``
    view of its bytes (any strides: the element size is the same): copy through both sides' views."""
    return tensor.view(torch.uint8) if tensor.dtype in _NO_COPY_KERNEL else tensor


def copy_flat_range_out(source: torch.Tensor, start: int, end: int, out: torch.Tensor) -> None:
    """Copy elements ``[start, end)`` (row-major) of any-strided ``source`` into flat ``out``."""
    source, out = copyable(source), copyable(out)
    position = 0
    for view in flat_range_views(source, start, end):
        count = view.numel()
        out[position : position + count].view(view.shape).copy_(view)
        position += count


def copy_flat_range_in(destination: torch.Tensor, start: int, data: torch.Tensor) -> None:
    """Copy flat ``data`` into elements ``[start, start + numel)`` of any-strided ``destination``."""
    destination, data = copyable(destination), copyable(data)
    position = 0
    for view in flat_range_views(destination, start, start + data.numel()):
        count = view.numel()
        view.copy_(data[position : position + count].view(view.shape))
        position += count
